#!/usr/bin/env python3
"""Generates the trace fixtures of lamina-plan's tests. Deterministic (fixed seed):
run it from this directory to rebuild the files; the tests read the committed copies.

- perfmon-worked-example.csv: a Windows file-and-database workload over 24 hours whose
  steady state is about 3,000 IOPS with one write in six, logged by perfmon on two
  hosts (one with _Total and per-disk instances, one with per-disk instances only),
  with LogicalDisk, CPU and memory counters mixed in, blank first row, a missed sample
  and a truncated row.
- synthetic-idle-spike-busy.csv: plain CSV with long idle periods, one short spike and
  a sustained busy period; mean about 260 IOPS, steady state about 500.
"""
import random

random.seed(20240415)


def worked_example():
    interval = 120  # seconds
    count = 24 * 3600 // interval
    hosts = {
        "SQL01": (0.7, [("0 C:", 0.1), ("1 D:", 0.6), ("2 E:", 0.3)], True),
        "FILE01": (0.3, [("0 C:", 0.5), ("1 F:", 0.5)], False),
    }
    counters = [
        "Disk Reads/sec",
        "Disk Writes/sec",
        "Disk Read Bytes/sec",
        "Disk Write Bytes/sec",
        "Avg. Disk Queue Length",
        "Avg. Disk sec/Transfer",
    ]
    header = ["(PDH-CSV 4.0) (GMT Daylight Time)(-60)"]
    for host, (_, disks, has_total) in hosts.items():
        instances = (["_Total"] if has_total else []) + [name for name, _ in disks]
        for instance in instances:
            for counter in counters:
                header.append(f"\\\\{host}\\PhysicalDisk({instance})\\{counter}")
        header.append(f"\\\\{host}\\LogicalDisk(C:)\\Disk Reads/sec")
        header.append(f"\\\\{host}\\LogicalDisk(C:)\\Disk Writes/sec")
        header.append(f"\\\\{host}\\Processor(_Total)\\% Processor Time")
        header.append(f"\\\\{host}\\Memory\\Available MBytes")

    def load(minute_of_day):
        hour = minute_of_day / 60
        if 8.5 <= hour < 17.5:
            level = 2780 if not 12 <= hour < 13 else 2300
            return max(0.0, random.gauss(level, 170))
        if 7.5 <= hour < 8.5:
            return 80 + (hour - 7.5) * 2700 + random.gauss(0, 100)
        if 17.5 <= hour < 18.5:
            return 2780 - (hour - 17.5) * 2450 + random.gauss(0, 100)
        if 18.5 <= hour < 22:
            return max(0.0, random.gauss(330, 40))
        return max(0.0, random.gauss(80, 20))

    rows = []
    for index in range(count):
        seconds = index * interval
        minute = seconds // 60
        stamp = f"04/15/2024 {minute // 60:02d}:{minute % 60:02d}:{seconds % 60:02d}.{random.randint(0, 999):03d}"
        total = load(minute)
        # The morning report run: six minutes at about twice the steady state.
        if 10 * 60 + 42 <= minute < 10 * 60 + 48:
            total = random.gauss(5800, 150)
        write_fraction = min(0.3, max(0.05, random.gauss(1 / 6, 0.01)))
        row = [stamp]
        for host, (share, disks, has_total) in hosts.items():
            values = []
            for _, disk_share in disks:
                reads = total * share * disk_share * (1 - write_fraction)
                writes = total * share * disk_share * write_fraction
                latency = random.uniform(0.005, 0.011)
                values.append(
                    [
                        reads,
                        writes,
                        reads * random.uniform(7800, 8600),
                        writes * random.uniform(15000, 17500),
                        (reads + writes) * latency,
                        latency,
                    ]
                )
            if has_total:
                transfers = sum(v[0] + v[1] for v in values)
                summed = [sum(v[i] for v in values) for i in range(5)]
                summed.append(
                    sum(v[5] * (v[0] + v[1]) for v in values) / transfers if transfers else 0.0
                )
                values.insert(0, summed)
            for value in values:
                row.extend(f"{number:.6f}" for number in value)
            row.append(f"{total * share * 0.1:.6f}")
            row.append(f"{total * share * 0.02:.6f}")
            row.append(f"{random.uniform(5, 60):.6f}")
            row.append(f"{random.uniform(2000, 9000):.0f}")
        if index == 0:
            # perfmon cannot compute rates for its first sample.
            row = [row[0]] + [" " for _ in row[1:]]
        rows.append(row)
    # A missed sample: FILE01's disk 1 has no write rate in one row.
    column = header.index("\\\\FILE01\\PhysicalDisk(1 F:)\\Disk Writes/sec")
    rows[400][column] = " "
    lines = [",".join(f'"{cell}"' for cell in header)]
    lines += [",".join(f'"{cell}"' for cell in row) for row in rows]
    # A row cut short when the log was copied while perfmon was writing.
    lines.insert(300, lines[300][: len(lines[300]) // 3])
    with open("perfmon-worked-example.csv", "w", newline="") as file:
        file.write("\r\n".join(lines) + "\r\n")


def synthetic():
    lines = ["timestamp,read_iops,write_iops,read_bytes_per_sec,write_bytes_per_sec,latency_ms,queue_depth"]
    for index in range(1440):
        minute = index
        if 7 * 60 <= minute < 7 * 60 + 700:
            total = random.uniform(435, 510)
        else:
            total = random.uniform(15, 35)
        # One five-minute spike at night (a backup job starting).
        if 2 * 60 <= minute < 2 * 60 + 5:
            total = 4000
        reads = total * 0.7
        writes = total - reads
        lines.append(
            f"2024-04-15T{minute // 60:02d}:{minute % 60:02d}:00,{reads:.2f},{writes:.2f},"
            f"{reads * 4096:.0f},{writes * 4096:.0f},{random.uniform(2, 6):.2f},{total * 0.004:.3f}"
        )
    with open("synthetic-idle-spike-busy.csv", "w") as file:
        file.write("\n".join(lines) + "\n")


worked_example()
synthetic()
