//! The open-loop load generator: requests arrive on a schedule (Poisson or fixed) that
//! does not wait for the server, and each request's latency is measured from its
//! *intended* arrival time, so time spent queued — in the server, in the socket, or
//! waiting for an in-flight slot because the server is slow — is counted. A server
//! that stalls cannot hide its queueing, unlike a generator that starts the clock when
//! it manages to send (fio's rate limiting).
//!
//! Each connection has a sending thread and a receiving thread on blocking sockets.
//! Threads, not tokio tasks: tokio's timer has a granularity of one millisecond — the
//! whole latency objective — while `nanosleep` with a 1 µs timer slack wakes within
//! microseconds. The sender sleeps until the next arrival, then sends every arrival
//! that is due in one write; if it wakes late, the lateness is in the latency (it is
//! the generator's, and reported apart as `issue_lateness`).

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::cpu::{CpuUsage, sample_tree};
use crate::nbd_client::{self, Endpoint, NbdClientError, Socket};
use lamina_nbd::wire;

/// Largest latency the histograms hold; longer ones are clamped to it.
const LATENCY_NANOSECONDS_MAX: u64 = 600_000_000_000;

/// Significant digits of the latency histograms (0.1 % resolution).
const HISTOGRAM_SIGNIFICANT_DIGITS: u8 = 3;

/// Bytes of requests gathered into one write before it is sent.
const BATCH_BYTES_MAX: usize = 256 * 1024;

/// The sender's timer slack: how late the kernel may wake it, in nanoseconds.
const SENDER_TIMER_SLACK_NS: libc::c_ulong = 1_000;

/// When the arrivals of a run follow each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Schedule {
    /// Exponential gaps (independent arrivals), per connection.
    Poisson,
    /// Equal gaps, connections out of phase.
    Fixed,
}

/// What writes carry and whether reads are checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DataMode {
    /// Writes carry one fixed buffer; reads are not checked.
    Unchecked,
    /// Every block holds [`fill_pattern`] of `seed` (prefill with
    /// [`prefill_pattern`]); writes write it again and every read is compared with it.
    Verified { seed: u64 },
}

/// One run of the generator at one offered rate.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LoadSpec {
    /// Requests per second over all connections.
    pub offered_per_second: f64,
    pub connections: u32,
    /// Arrivals before this are served but not recorded.
    pub warmup: Duration,
    /// The recorded part of the schedule.
    pub measured: Duration,
    pub schedule: Schedule,
    pub read_percent: u8,
    pub block_bytes: u32,
    /// Requests cover `[0, region_bytes)` uniformly at block boundaries.
    pub region_bytes: u64,
    /// Requests in flight per connection at most; an arrival that finds them all busy
    /// waits (and its wait is in its latency).
    pub in_flight_per_connection_max: usize,
    /// After the schedule ends, arrivals not yet sent are given this long; those still
    /// unsent then are counted as `unissued` and recorded with the wait they had.
    pub drain_timeout: Duration,
    pub data: DataMode,
    pub seed: u64,
}

/// Percentiles of one latency distribution, microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LatencySummary {
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
    pub mean_us: f64,
}

impl LatencySummary {
    fn of(histogram: &Histogram<u64>) -> Self {
        let at = |quantile: f64| histogram.value_at_quantile(quantile) as f64 / 1_000.0;
        Self {
            p50_us: at(0.5),
            p90_us: at(0.9),
            p99_us: at(0.99),
            p999_us: at(0.999),
            max_us: histogram.max() as f64 / 1_000.0,
            mean_us: histogram.mean() / 1_000.0,
        }
    }
}

/// What one run measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LoadResult {
    pub offered_per_second: f64,
    /// Recorded requests divided by the time from the window's start to the later of
    /// its end and the last recorded completion.
    pub achieved_per_second: f64,
    /// Requests whose intended arrival was in the measured window and that completed.
    pub completed: u64,
    /// From intended arrival to completion: the figure that counts.
    pub latency: LatencySummary,
    /// From the moment the request was sent to its completion (what fio reports).
    pub service: LatencySummary,
    /// From intended arrival to sending: the generator's own lateness plus waits for a
    /// free in-flight slot.
    pub issue_lateness: LatencySummary,
    /// Replies with an error.
    pub errors: u64,
    /// Reads whose data differed from the pattern (only with [`DataMode::Verified`]).
    pub mismatches: u64,
    /// Arrivals never sent before the drain timeout (recorded with their wait so far).
    pub unissued: u64,
    /// Server CPU per completed request over the window, when a server PID was given.
    pub server_cpu_us_per_op: Option<f64>,
}

/// Fills `buffer` with the pattern of block `block_index` under `seed`: every 8 bytes
/// differ, and every block and seed gives different bytes.
pub fn fill_pattern(seed: u64, block_index: u64, buffer: &mut [u8]) {
    assert!(buffer.len().is_multiple_of(8), "blocks are whole words");
    for (word_index, word) in buffer.chunks_exact_mut(8).enumerate() {
        let mut value = seed
            ^ block_index.wrapping_mul(0x9e37_79b9_7f4a_7c15)
            ^ (word_index as u64).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        // splitmix64's finaliser: neighbouring inputs give unrelated words.
        value = (value ^ (value >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        value = (value ^ (value >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        value ^= value >> 31;
        word.copy_from_slice(&value.to_le_bytes());
    }
}

/// Writes the pattern of `seed` to every block of `[0, region_bytes)`, one request at
/// a time, and waits for each reply.
pub fn prefill_pattern(
    endpoint: &Endpoint,
    region_bytes: u64,
    block_bytes: u32,
    seed: u64,
) -> anyhow::Result<()> {
    let mut connection = nbd_client::connect(endpoint)?;
    let block = u64::from(block_bytes);
    let mut buffer = vec![0u8; usize::try_from(block_bytes).expect("a block fits in memory")];
    for block_index in 0..region_bytes / block {
        fill_pattern(seed, block_index, &mut buffer);
        let header = nbd_client::request_header(
            wire::CMD_WRITE,
            block_index,
            block_index * block,
            block_bytes,
        );
        let socket = &mut connection.socket;
        std::io::Write::write_all(socket, &header)?;
        std::io::Write::write_all(socket, &buffer)?;
        let reply = nbd_client::read_reply_header(socket)?;
        anyhow::ensure!(
            reply.error == 0,
            "prefill write at offset {} of {block_bytes} bytes failed with error {}",
            block_index * block,
            reply.error
        );
    }
    nbd_client::disconnect(&mut connection.socket);
    Ok(())
}

/// A request sent and not yet answered.
#[derive(Debug, Clone, Copy)]
struct InFlight {
    intended: Instant,
    sent: Instant,
    block_index: u64,
    is_read: bool,
}

/// The in-flight table of one connection; a request's cookie is its slot.
#[derive(Debug)]
struct Slots {
    entries: Vec<Option<InFlight>>,
    free: Vec<usize>,
}

#[derive(Debug)]
struct Shared {
    slots: Mutex<Slots>,
    slot_freed: Condvar,
}

impl Shared {
    fn new(capacity: usize) -> Self {
        assert!(capacity > 0, "at least one request in flight");
        Self {
            slots: Mutex::new(Slots {
                entries: vec![None; capacity],
                free: (0..capacity).rev().collect(),
            }),
            slot_freed: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Slots> {
        self.slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn in_flight(&self) -> usize {
        let slots = self.lock();
        slots.entries.len() - slots.free.len()
    }
}

/// The three histograms and counters of one connection.
#[derive(Debug)]
struct Recorder {
    latency: Histogram<u64>,
    service: Histogram<u64>,
    issue_lateness: Histogram<u64>,
    window_start: Instant,
    errors: u64,
    mismatches: u64,
    unissued: u64,
    last_completion: Option<Instant>,
}

impl Recorder {
    fn new(window_start: Instant) -> Self {
        let histogram = || {
            Histogram::new_with_bounds(1, LATENCY_NANOSECONDS_MAX, HISTOGRAM_SIGNIFICANT_DIGITS)
                .expect("valid histogram bounds")
        };
        Self {
            latency: histogram(),
            service: histogram(),
            issue_lateness: histogram(),
            window_start,
            errors: 0,
            mismatches: 0,
            unissued: 0,
            last_completion: None,
        }
    }

    fn record(histogram: &mut Histogram<u64>, duration: Duration) {
        let nanoseconds = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
        histogram.saturating_record(nanoseconds.clamp(1, LATENCY_NANOSECONDS_MAX));
    }

    fn completed(&mut self, request: &InFlight, completion: Instant) {
        if request.intended < self.window_start {
            return;
        }
        Self::record(&mut self.latency, completion - request.intended);
        Self::record(&mut self.service, completion - request.sent);
        Self::record(&mut self.issue_lateness, request.sent - request.intended);
        self.last_completion = Some(
            self.last_completion
                .map_or(completion, |last| last.max(completion)),
        );
    }

    fn merge(&mut self, other: &Recorder) {
        self.latency.add(&other.latency).expect("same bounds");
        self.service.add(&other.service).expect("same bounds");
        self.issue_lateness
            .add(&other.issue_lateness)
            .expect("same bounds");
        self.errors += other.errors;
        self.mismatches += other.mismatches;
        self.unissued += other.unissued;
        self.last_completion = match (self.last_completion, other.last_completion) {
            (Some(left), Some(right)) => Some(left.max(right)),
            (left, right) => left.or(right),
        };
    }
}

/// The arrival times of one connection.
struct Arrivals {
    next: Instant,
    mean_gap_seconds: f64,
    schedule: Schedule,
    generator: rand::rngs::SmallRng,
}

impl Arrivals {
    fn advance(&mut self) {
        let gap = match self.schedule {
            Schedule::Fixed => self.mean_gap_seconds,
            Schedule::Poisson => {
                // Inverse transform of a uniform in (0, 1]: an exponential gap.
                let uniform: f64 = 1.0 - self.generator.random::<f64>();
                -uniform.ln() * self.mean_gap_seconds
            }
        };
        self.next += Duration::from_secs_f64(gap);
    }
}

/// Runs the generator against `endpoint` at `spec`; with `server_pid`, the server's
/// CPU time over the measured window is divided by the completed requests.
pub fn run_load(
    endpoint: &Endpoint,
    spec: &LoadSpec,
    server_pid: Option<u32>,
) -> anyhow::Result<LoadResult> {
    assert!(spec.offered_per_second > 0.0, "a rate is positive");
    assert!(spec.connections > 0, "at least one connection");
    assert!(
        spec.block_bytes > 0 && spec.region_bytes >= u64::from(spec.block_bytes),
        "the region holds at least one block"
    );
    let mut connections = Vec::new();
    for _ in 0..spec.connections {
        connections.push(nbd_client::connect(endpoint)?);
    }
    // A little time for every thread to start before the first arrival.
    let start = Instant::now() + Duration::from_millis(20);
    let window_start = start + spec.warmup;
    let window_end = window_start + spec.measured;
    let (recorders, cpu) = std::thread::scope(|scope| -> anyhow::Result<_> {
        let sampler = scope.spawn(move || sample_window(server_pid, window_start, window_end));
        let mut workers = Vec::new();
        for (index, connection) in connections.into_iter().enumerate() {
            let worker = ConnectionRun {
                spec,
                index,
                start,
                window_start,
                window_end,
            };
            workers.push(scope.spawn(move || worker.run(connection.socket)));
        }
        let mut recorders = Vec::new();
        for worker in workers {
            recorders.push(worker.join().expect("connection threads do not panic")?);
        }
        let cpu = sampler.join().expect("the sampler does not panic");
        Ok((recorders, cpu))
    })?;
    let mut total = Recorder::new(window_start);
    for recorder in &recorders {
        total.merge(recorder);
    }
    Ok(summarise(spec, &total, window_start, window_end, cpu))
}

fn sample_window(
    server_pid: Option<u32>,
    window_start: Instant,
    window_end: Instant,
) -> Option<CpuUsage> {
    let pid = server_pid?;
    std::thread::sleep(window_start.saturating_duration_since(Instant::now()));
    let start = sample_tree(pid)?;
    std::thread::sleep(window_end.saturating_duration_since(Instant::now()));
    let end = sample_tree(pid)?;
    CpuUsage::between(&start, &end)
}

fn summarise(
    spec: &LoadSpec,
    total: &Recorder,
    window_start: Instant,
    window_end: Instant,
    cpu: Option<CpuUsage>,
) -> LoadResult {
    let completed = total.latency.len();
    let finish = total
        .last_completion
        .map_or(window_end, |last| last.max(window_end));
    let elapsed = (finish - window_start).as_secs_f64();
    let achieved_per_second = if elapsed > 0.0 {
        completed as f64 / elapsed
    } else {
        0.0
    };
    LoadResult {
        offered_per_second: spec.offered_per_second,
        achieved_per_second,
        completed,
        latency: LatencySummary::of(&total.latency),
        service: LatencySummary::of(&total.service),
        issue_lateness: LatencySummary::of(&total.issue_lateness),
        errors: total.errors,
        mismatches: total.mismatches,
        unissued: total.unissued,
        server_cpu_us_per_op: cpu
            .and_then(|usage| usage.microseconds_per_operation(achieved_per_second)),
    }
}

/// One connection's part of a run.
#[derive(Clone, Copy)]
struct ConnectionRun<'a> {
    spec: &'a LoadSpec,
    index: usize,
    start: Instant,
    window_start: Instant,
    window_end: Instant,
}

impl ConnectionRun<'_> {
    fn run(self, socket: Socket) -> anyhow::Result<Recorder> {
        let shared = Shared::new(self.spec.in_flight_per_connection_max);
        let receive_socket = socket.try_clone()?;
        std::thread::scope(|scope| {
            let receiver = scope.spawn(|| self.receive(receive_socket, &shared));
            let sent = self.send(socket, &shared);
            let mut recorder = receiver.join().expect("the receiver does not panic")?;
            let unissued = sent?;
            recorder.unissued = unissued.count;
            recorder.latency.add(&unissued.waits).expect("same bounds");
            Ok(recorder)
        })
    }

    fn arrivals(&self) -> Arrivals {
        let connections = f64::from(self.spec.connections);
        let mean_gap_seconds = connections / self.spec.offered_per_second;
        // Fixed schedules are put out of phase so that connections do not send together.
        let phase = mean_gap_seconds * self.index as f64 / connections;
        Arrivals {
            next: self.start + Duration::from_secs_f64(phase),
            mean_gap_seconds,
            schedule: self.spec.schedule,
            generator: rand::rngs::SmallRng::seed_from_u64(
                self.spec.seed ^ ((self.index as u64) << 32),
            ),
        }
    }

    /// Sends every arrival of the schedule; returns the ones never sent.
    fn send(&self, mut socket: Socket, shared: &Shared) -> anyhow::Result<Unissued> {
        set_timer_slack();
        let spec = self.spec;
        let block = u64::from(spec.block_bytes);
        let block_count = spec.region_bytes / block;
        let block_length = usize::try_from(spec.block_bytes).expect("a block fits in memory");
        let mut arrivals = self.arrivals();
        let mut choices =
            rand::rngs::SmallRng::seed_from_u64(spec.seed.wrapping_add(self.index as u64 + 1));
        let mut fixed_payload = vec![0u8; block_length];
        fill_pattern(spec.seed, u64::MAX, &mut fixed_payload);
        let mut payload = vec![0u8; block_length];
        let mut batch = Batch::default();
        let give_up = self.window_end + spec.drain_timeout;
        let mut unissued = Unissued {
            count: 0,
            waits: Recorder::new(self.window_start).latency,
        };
        while arrivals.next < self.window_end {
            let now = Instant::now();
            if arrivals.next > now {
                std::thread::sleep(arrivals.next - now);
            }
            let now = Instant::now();
            if now > give_up {
                self.give_up(&mut arrivals, now, &mut unissued);
                break;
            }
            while arrivals.next <= now
                && arrivals.next < self.window_end
                && batch.bytes.len() < BATCH_BYTES_MAX
            {
                let slot = match take_slot(shared, false) {
                    Some(slot) => slot,
                    None => {
                        batch.send(&mut socket, shared)?;
                        take_slot(shared, true).expect("waits for a slot")
                    }
                };
                let block_index = choices.random_range(0..block_count);
                let is_read = choices.random_range(0..100u8) < spec.read_percent;
                let command = if is_read {
                    wire::CMD_READ
                } else {
                    wire::CMD_WRITE
                };
                let cookie = u64::try_from(slot).expect("slot indexes fit in a cookie");
                batch.bytes.extend_from_slice(&nbd_client::request_header(
                    command,
                    cookie,
                    block_index * block,
                    spec.block_bytes,
                ));
                if !is_read {
                    match spec.data {
                        DataMode::Unchecked => batch.bytes.extend_from_slice(&fixed_payload),
                        DataMode::Verified { seed } => {
                            fill_pattern(seed, block_index, &mut payload);
                            batch.bytes.extend_from_slice(&payload);
                        }
                    }
                }
                batch.requests.push((
                    slot,
                    InFlight {
                        intended: arrivals.next,
                        sent: now,
                        block_index,
                        is_read,
                    },
                ));
                arrivals.advance();
            }
            batch.send(&mut socket, shared)?;
        }
        self.drain(&mut socket, shared);
        Ok(unissued)
    }

    /// Counts the arrivals never sent and records, for those in the window, the wait
    /// they had when the generator gave up (a lower bound of their latency).
    fn give_up(&self, arrivals: &mut Arrivals, now: Instant, unissued: &mut Unissued) {
        while arrivals.next < self.window_end {
            unissued.count += 1;
            if arrivals.next >= self.window_start {
                Recorder::record(&mut unissued.waits, now - arrivals.next);
            }
            arrivals.advance();
        }
    }

    /// Waits until every request sent has its reply (or the drain timeout passed), then
    /// shuts the socket so that the receiver's read ends.
    fn drain(&self, socket: &mut Socket, shared: &Shared) {
        let deadline = Instant::now().max(self.window_end) + self.spec.drain_timeout;
        let mut slots = shared.lock();
        while slots.entries.len() > slots.free.len() && Instant::now() < deadline {
            let wait = deadline.saturating_duration_since(Instant::now());
            slots = shared
                .slot_freed
                .wait_timeout(slots, wait)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
        drop(slots);
        nbd_client::disconnect(socket);
        socket.shutdown();
    }

    fn receive(&self, mut socket: Socket, shared: &Shared) -> anyhow::Result<Recorder> {
        let mut recorder = Recorder::new(self.window_start);
        let block_length = usize::try_from(self.spec.block_bytes).expect("a block fits in memory");
        let mut data = vec![0u8; block_length];
        let mut expected = vec![0u8; block_length];
        loop {
            let header = match nbd_client::read_reply_header(&mut socket) {
                Ok(header) => header,
                // The sender shut the socket after the last reply, or the server closed
                // it on NBD_CMD_DISC: the run is over.
                Err(_) if shared.in_flight() == 0 => return Ok(recorder),
                Err(error) => return Err(error.into()),
            };
            let slot = usize::try_from(header.cookie).ok();
            let request = {
                let mut slots = shared.lock();
                slot.and_then(|slot| slots.entries.get_mut(slot))
                    .and_then(Option::take)
            }
            .ok_or(NbdClientError::UnknownCookie {
                cookie: header.cookie,
            })?;
            if request.is_read && header.error == 0 {
                std::io::Read::read_exact(&mut socket, &mut data).map_err(|source| {
                    anyhow::anyhow!(
                        "reading {block_length} bytes of block {}: {source}",
                        request.block_index
                    )
                })?;
            }
            let completion = Instant::now();
            release_slot(shared, slot.expect("the slot was found"));
            if header.error != 0 {
                recorder.errors += 1;
            } else if let (true, DataMode::Verified { seed }) = (request.is_read, self.spec.data) {
                fill_pattern(seed, request.block_index, &mut expected);
                if data != expected {
                    recorder.mismatches += 1;
                }
            }
            recorder.completed(&request, completion);
        }
    }
}

/// Arrivals a connection never sent: how many, and the waits they had.
struct Unissued {
    count: u64,
    waits: Histogram<u64>,
}

/// Requests gathered for one write.
#[derive(Default)]
struct Batch {
    bytes: Vec<u8>,
    requests: Vec<(usize, InFlight)>,
}

impl Batch {
    /// Enters the requests in the in-flight table (stamped as sent now) and writes them.
    fn send(&mut self, socket: &mut Socket, shared: &Shared) -> anyhow::Result<()> {
        if self.requests.is_empty() {
            return Ok(());
        }
        let sent = Instant::now();
        {
            let mut slots = shared.lock();
            for (slot, request) in self.requests.drain(..) {
                slots.entries[slot] = Some(InFlight { sent, ..request });
            }
        }
        std::io::Write::write_all(socket, &self.bytes).map_err(|source| {
            anyhow::anyhow!("sending {} bytes of requests: {source}", self.bytes.len())
        })?;
        self.bytes.clear();
        Ok(())
    }
}

/// A free slot, reserved; with `wait`, blocks until one is free.
fn take_slot(shared: &Shared, wait: bool) -> Option<usize> {
    let mut slots = shared.lock();
    loop {
        if let Some(slot) = slots.free.pop() {
            return Some(slot);
        }
        if !wait {
            return None;
        }
        slots = shared
            .slot_freed
            .wait(slots)
            .unwrap_or_else(std::sync::PoisonError::into_inner);
    }
}

fn release_slot(shared: &Shared, slot: usize) {
    shared.lock().free.push(slot);
    shared.slot_freed.notify_all();
}

/// Lets the kernel wake this thread within a microsecond of its sleep's end (the
/// default slack, 50 µs, would be a twentieth of the latency objective).
fn set_timer_slack() {
    // SAFETY: prctl(PR_SET_TIMERSLACK) takes integer arguments and affects only the
    // calling thread.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, SENDER_TIMER_SLACK_NS);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_differ_between_blocks_and_seeds() {
        let mut first = vec![0u8; 4096];
        let mut second = vec![0u8; 4096];
        fill_pattern(1, 10, &mut first);
        fill_pattern(1, 11, &mut second);
        assert_ne!(first, second);
        fill_pattern(2, 10, &mut second);
        assert_ne!(first, second);
        fill_pattern(1, 10, &mut second);
        assert_eq!(first, second);
        assert!(
            first
                .chunks_exact(8)
                .zip(first.chunks_exact(8).skip(1))
                .all(|(left, right)| left != right)
        );
    }

    #[test]
    fn poisson_gaps_average_the_rate() {
        let start = Instant::now();
        let mut arrivals = Arrivals {
            next: start,
            mean_gap_seconds: 0.001,
            schedule: Schedule::Poisson,
            generator: rand::rngs::SmallRng::seed_from_u64(5),
        };
        for _ in 0..20_000 {
            arrivals.advance();
        }
        let mean = (arrivals.next - start).as_secs_f64() / 20_000.0;
        assert!((0.00095..0.00105).contains(&mean), "mean gap {mean}");
    }
}
