// The management page: reads /v1/web/overview every second, renders it, and
// sends the action buttons' operations to /v1/web/operations after a
// confirmation. Over TCP, changing operations need the token given in the
// page's address as #token=...; it is kept for the tab's session only.
"use strict";

const REFRESH_MS = 1000;
const params = new URLSearchParams(location.hash.slice(1));
if (params.get("token")) {
  sessionStorage.setItem("lamina-token", params.get("token"));
  history.replaceState(null, "", location.pathname);
}
const token = sessionStorage.getItem("lamina-token");
let overview = null;

function headers() {
  const result = { "content-type": "application/json" };
  if (token) result.authorization = "Bearer " + token;
  return result;
}

function bytes(value) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  let index = 0;
  while (value >= 1024 && index < units.length - 1) { value /= 1024; index++; }
  return (index === 0 ? value : value.toFixed(1)) + " " + units[index];
}

function parseSize(text) {
  const match = /^\s*(\d+(?:\.\d+)?)\s*([KMGTP]?)i?B?\s*$/i.exec(text);
  if (!match) throw new Error("not a size: " + text);
  const power = "KMGTP".indexOf(match[2].toUpperCase()) + 1;
  return Math.round(Number(match[1]) * Math.pow(1024, power));
}

function element(tag, text, attributes) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  for (const [name, value] of Object.entries(attributes || {})) node.setAttribute(name, value);
  return node;
}

function setBytes(id, value) {
  const node = document.getElementById(id);
  node.textContent = bytes(value);
  node.dataset.bytes = String(value);
}

function show(message) {
  const node = document.getElementById("message");
  node.textContent = message;
  node.hidden = !message;
}

async function operation(body, question) {
  if (!confirm(question)) return;
  const response = await fetch("/v1/web/operations", {
    method: "POST", headers: headers(), body: JSON.stringify({ confirmed: true, operation: body }),
  });
  const answer = await response.json().catch(() => ({}));
  show(response.ok ? "" : (answer.error || response.statusText));
  refresh();
}

// The badge is decided by the daemon (web/health.rs) from what `pool status`
// warns about; the page only shows it, with the reasons beside it.
function renderHealth(health) {
  const badge = document.getElementById("pool-health");
  badge.textContent = health.state;
  badge.className = "badge " + health.state;
  const reasons = health.reasons.map((reason) => reason.text).join("; ");
  badge.title = reasons;
  document.getElementById("pool-health-reasons").textContent = reasons;
}

function renderPool(pool) {
  setBytes("pool-capacity", pool.capacity_bytes);
  setBytes("pool-used", pool.used_bytes);
  setBytes("pool-free", pool.free_bytes);
  document.getElementById("pool-used-percent").textContent = pool.used_percent.toFixed(1) + " %";
  // Older daemons send no compression figures: a ratio of 1.
  const poolRatio = document.getElementById("pool-compress-ratio");
  poolRatio.textContent = `${(pool.compress_ratio ?? 1).toFixed(2)}x (logical ${bytes(pool.logical_bytes ?? 0)}, stored ${bytes(pool.stored_bytes ?? 0)})`;
  poolRatio.dataset.ratio = pool.compress_ratio ?? 1;
  const tiers = document.querySelector("#tiers tbody");
  tiers.replaceChildren();
  const tierList = [["flash", pool.flash]].concat(pool.capacity ? [["capacity", pool.capacity]] : []);
  for (const [name, space] of tierList) {
    const row = element("tr", null, { "data-tier": name });
    row.append(element("td", name), element("td", bytes(space.size_bytes), { "data-bytes": space.size_bytes }),
      element("td", bytes(space.used_bytes), { "data-bytes": space.used_bytes }),
      element("td", bytes(space.free_bytes), { "data-bytes": space.free_bytes }));
    tiers.append(row);
  }
  document.getElementById("cleaner-state").textContent = pool.cleaner_state;
  document.getElementById("cleaner-pressure").textContent = pool.cleaner_pressure.toFixed(2);
  document.getElementById("cleaner-relocated").textContent = pool.cleaner_relocated_blocks;
  document.getElementById("tier-promoted").textContent = pool.promoted_blocks;
  document.getElementById("tier-demoted").textContent = pool.demoted_blocks;
  const scrub = pool.scrub || {};
  document.getElementById("scrub-state").textContent =
    (scrub.state || "-") + (scrub.blocks_total ? ` (${scrub.blocks_scrubbed}/${scrub.blocks_total})` : "");
  const rebuild = pool.rebuild || {};
  const percent = rebuild.bytes_total ? Math.floor((100 * rebuild.bytes_done) / rebuild.bytes_total) : 0;
  const left = rebuild.seconds_left != null ? `, ${rebuild.seconds_left} s left` : "";
  document.getElementById("rebuild-state").textContent = rebuild.state && rebuild.state !== "none"
    ? `${rebuild.state}: ${bytes(rebuild.bytes_done)} of ${bytes(rebuild.bytes_total)} (${percent}%), ${bytes(rebuild.bytes_per_second)}/s${left}`
      + (rebuild.error ? ` (${rebuild.error})` : "")
    : "-";
  document.getElementById("rebuild-state").dataset.rebuildState = rebuild.state || "none";
  renderArrays(pool.layout);
}

function renderArrays(layout) {
  const holder = document.getElementById("arrays");
  holder.replaceChildren();
  if (!layout) {
    holder.append(element("p", "One device per tier (no array)."));
    return;
  }
  for (const tier of layout.tiers) {
    holder.append(element("h3", `${tier.tier}: ${tier.redundancy}, ${tier.state}`, { "data-tier-state": tier.state }));
    const table = element("table", null, { class: "members" });
    const head = element("tr");
    head.append(element("th", "Device"), element("th", "State"), element("th", "Read"), element("th", "Written"), element("th", "Errors"),
      element("th", "Repaired", { title: "blocks that failed their checksum and were rewritten from redundancy" }),
      element("th", "Parity repaired", { title: "parity columns and metadata copies a scrub found wrong and rewrote" }));
    table.append(head);
    for (const device of tier.devices) {
      const row = element("tr", null, { "data-device": device.path, "data-state": device.state });
      const state = device.replacement ? `${device.state}, replacing with ${device.replacement.split("/").pop()}` : device.state;
      row.append(element("td", device.path.split("/").pop(), { title: device.path }), element("td", state),
        element("td", bytes(device.bytes_read), { class: "number" }),
        element("td", bytes(device.bytes_written), { class: "number" }),
        element("td", device.io_errors, { class: "number" }),
        element("td", device.checksum_errors_repaired, { class: "number" }),
        element("td", device.parity_repaired ?? 0, { class: "number" }));
      table.append(row);
    }
    holder.append(table);
  }
}

function latest(volumeName) {
  const entry = (overview.history || []).find((history) => history.volume === volumeName);
  return entry && entry.samples.length ? entry.samples[entry.samples.length - 1] : null;
}

function actionButton(label, handler) {
  const button = element("button", label);
  button.addEventListener("click", handler);
  return button;
}

function renderVolumes(volumes, snapshots) {
  const body = document.querySelector("#volumes tbody");
  body.replaceChildren();
  for (const volume of volumes) {
    const sample = latest(volume.name);
    const iops = sample ? Math.round(sample.read_iops + sample.write_iops) : 0;
    const p99 = sample ? Math.max(sample.read_p99_us || 0, sample.write_p99_us || 0) : 0;
    const row = element("tr", null, { "data-volume": volume.name });
    row.append(element("td", volume.name),
      element("td", bytes(volume.size_bytes), { "data-bytes": volume.size_bytes, class: "number" }),
      element("td", bytes(volume.allocated_bytes), { "data-bytes": volume.allocated_bytes, class: "number" }),
      element("td", bytes(volume.stored_bytes ?? 0), { "data-bytes": volume.stored_bytes ?? 0, class: "number" }),
      element("td", `${(volume.compress_ratio ?? 1).toFixed(2)}x`, { "data-ratio": volume.compress_ratio ?? 1, class: "number", title: volume.compression || "off" }),
      element("td", volume.snapshot_count, { class: "number" }),
      element("td", volume.origin || ""),
      element("td", iops, { class: "number" }),
      element("td", p99 ? p99.toFixed(0) + " µs" : "-", { class: "number" }));
    const actions = element("td");
    actions.append(
      actionButton("Resize", () => {
        const size = prompt(`New size of ${volume.name}`, bytes(volume.size_bytes).replace(" ", ""));
        if (size) operation({ operation: "volume_resize", name: volume.name, size_bytes: parseSize(size), force: false }, `Resize ${volume.name} to ${size}?`);
      }),
      actionButton("Snapshot", () => {
        const snapshot = prompt(`Snapshot name for ${volume.name}`);
        if (snapshot) operation({ operation: "snapshot_create", volume: volume.name, snapshot }, `Snapshot ${volume.name} as ${volume.name}@${snapshot}?`);
      }),
      actionButton("Delete", () => operation({ operation: "volume_delete", name: volume.name }, `Delete ${volume.name} and its snapshots? This cannot be undone.`)));
    row.append(actions);
    body.append(row);
    for (const snapshot of snapshots.filter((snapshot) => snapshot.volume === volume.name)) {
      const snapshotRow = element("tr", null, { class: "snapshot", "data-snapshot": `${snapshot.volume}@${snapshot.name}` });
      snapshotRow.append(element("td", `@${snapshot.name}`), element("td"), element("td"), element("td"), element("td"), element("td"), element("td"), element("td"), element("td"));
      const cell = element("td");
      cell.append(actionButton("Clone", () => {
        const name = prompt(`Name of the clone of ${snapshot.volume}@${snapshot.name}`);
        if (name) operation({ operation: "volume_clone", volume: snapshot.volume, snapshot: snapshot.name, new_name: name }, `Clone ${snapshot.volume}@${snapshot.name} as ${name}?`);
      }));
      snapshotRow.append(cell);
      body.append(snapshotRow);
    }
  }
  const select = document.getElementById("chart-volume");
  const chosen = select.value;
  select.replaceChildren(...volumes.map((volume) => element("option", volume.name, { value: volume.name })));
  if (volumes.some((volume) => volume.name === chosen)) select.value = chosen;
}

function drawChart(canvas, series, colours) {
  const context = canvas.getContext("2d");
  const { width, height } = canvas;
  context.clearRect(0, 0, width, height);
  const values = series.flat().filter((value) => Number.isFinite(value));
  const top = Math.max(1, ...values) * 1.1;
  context.strokeStyle = "#e3e6ea";
  context.fillStyle = "#555";
  context.font = "11px sans-serif";
  for (let line = 0; line <= 4; line++) {
    const y = height - 16 - (height - 26) * line / 4;
    context.beginPath(); context.moveTo(40, y); context.lineTo(width, y); context.stroke();
    context.fillText(String(Math.round(top * line / 4)), 2, y + 4);
  }
  series.forEach((points, index) => {
    context.strokeStyle = colours[index];
    context.lineWidth = 2;
    context.beginPath();
    let drawing = false;
    points.forEach((value, position) => {
      // A second without requests has no latency: a gap, not a zero.
      if (!Number.isFinite(value)) { drawing = false; return; }
      const x = 40 + (width - 42) * position / Math.max(1, points.length - 1);
      const y = height - 16 - (height - 26) * value / top;
      if (drawing) context.lineTo(x, y); else context.moveTo(x, y);
      drawing = true;
    });
    context.stroke();
  });
  context.fillStyle = "#555";
  const seconds = Math.round(pointsSpan(series) * (overview.sample_interval_ms || 1000) / 1000);
  context.fillText(`last ${seconds} s`, width - 70, height - 3);
}

function pointsSpan(series) {
  return Math.max(0, ...series.map((points) => points.length - 1));
}

function renderCharts() {
  const name = document.getElementById("chart-volume").value;
  const entry = (overview.history || []).find((history) => history.volume === name);
  const samples = entry ? entry.samples : [];
  const colours = ["#2f6fdf", "#e0862a"];
  drawChart(document.getElementById("chart-iops"),
    [samples.map((sample) => sample.read_iops), samples.map((sample) => sample.write_iops)], colours);
  drawChart(document.getElementById("chart-latency"),
    [samples.map((sample) => sample.read_p99_us ?? NaN), samples.map((sample) => sample.write_p99_us ?? NaN)], colours);
}

async function refresh() {
  try {
    const response = await fetch("/v1/web/overview", { headers: headers() });
    if (!response.ok) {
      const answer = await response.json().catch(() => ({}));
      show(answer.error || response.statusText);
      return;
    }
    overview = await response.json();
    renderHealth(overview.health);
    renderPool(overview.pool);
    renderVolumes(overview.volumes, overview.snapshots);
    renderCharts();
    document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
    document.body.dataset.loaded = "true";
  } catch (error) {
    show("cannot reach the daemon: " + error);
  }
}

document.getElementById("create-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const name = document.getElementById("create-name").value;
  const size = document.getElementById("create-size").value;
  let sizeBytes;
  try { sizeBytes = parseSize(size); } catch (error) { show(error.message); return; }
  operation({ operation: "volume_create", name, size_bytes: sizeBytes }, `Create volume ${name} of ${size}?`);
});
document.getElementById("chart-volume").addEventListener("change", renderCharts);
refresh();
setInterval(refresh, REFRESH_MS);
