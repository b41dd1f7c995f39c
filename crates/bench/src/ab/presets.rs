//! The comparisons `lamina-bench ab` knows, each a [`Scenario`] written as data: the
//! rows (peers, lamina builds and their cache settings), the workloads and the shared
//! pool, as the scripts they replace ran them (decision 0060). What each measures and
//! which BENCHMARKS.md sections quote it is in docs/bench.md.

use std::path::PathBuf;

use serde::Serialize;

use crate::fio::{Pattern, StepSpec};
use crate::runner::{Preparation, Row, Scenario, Server, SharedPool, Workload};

/// 4 KiB: every workload's block.
const BLOCK_BYTES: u64 = 4096;
/// The queue depth of the closed-loop workloads (per connection: split by `connections`).
const DEEP_QUEUE_DEPTH: u32 = 32;
/// The read share of the 70/30 mix, in percent.
const MIX_READ_PERCENT: u8 = 70;
/// The shared pool's file is this many times the data (room for the log's free
/// space), plus room for the metadata and reserves a small pool would run out of.
const SHARED_POOL_FILE_FACTOR: u64 = 3;
const SHARED_POOL_HEADROOM_BYTES: u64 = 512 << 20;
/// A fresh embedded pool is this many times its volume.
const FRESH_POOL_FACTOR: u64 = 4;
/// A warm memory cache holds this many times the data: every read hits once warm.
const WARM_CACHE_FACTOR: u64 = 2;

/// The comparisons.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Preset {
    /// 4 KiB random reads QD32 and QD1: nbdkit memory, then each build with its
    /// memory cache warm and cold, on one shared 2 GiB pool (was bench-read-ab.sh).
    ReadAb,
    /// Cache miss: each build with its memory cache off, random read QD32 and QD1,
    /// 70/30 and random write QD32, and fio on a file of the same data (was
    /// bench-cache-miss.sh).
    CacheMiss,
    /// Random reads (cache warm) and writes through 1, 2, 4 and 8 connections, the
    /// total depth 32 (was bench-connections.sh).
    Connections,
    /// Server CPU per 4 KiB random write: a fresh filled pool per build and round,
    /// `--runs-per-pool` runs in a row, nbdkit memory as the peer (was
    /// bench-write-cpu.sh).
    WriteCpu,
    /// The read ceiling: nbdkit null and memory, lamina warm, on holes and cold, fio
    /// and qemu-nbd (cache off) on lamina's own pool file (was bench-read-ceiling.sh).
    ReadCeiling,
    /// Server CPU per operation of random read, random write and 70/30 on a fresh
    /// filled embedded pool (was scripts/cpu-per-op).
    CpuPerOp,
}

/// A lamina memory cache setting of `read-ab`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Cache {
    /// The cache holds the volume, read once after the start.
    Warm,
    /// `memory_cache_bytes = 0`.
    Cold,
}

/// A lamina build under comparison.
#[derive(Debug, Clone, Serialize)]
pub struct Build {
    pub label: String,
    pub program: PathBuf,
}

/// What the command line chose, the presets' defaults filled in.
#[derive(Debug, Clone)]
pub struct Choices {
    pub builds: Vec<Build>,
    pub rounds: u32,
    pub runtime_seconds: u64,
    pub ramp_seconds: u64,
    pub size_bytes: u64,
    pub connections: Vec<u32>,
    pub caches: Vec<Cache>,
    pub runs_per_pool: u32,
    pub mixed: bool,
    pub memory_cache_bytes: Option<u64>,
    /// `KEY = VALUE` lines of lamina's `[server]` section.
    pub server_settings: Vec<String>,
}

impl Preset {
    /// The preset's size of data, runtime per workload and ramp, in bytes and seconds.
    pub fn defaults(self) -> (u64, u64, u64) {
        match self {
            Preset::ReadAb | Preset::ReadCeiling => (2 << 30, 6, 1),
            Preset::CacheMiss => (2 << 30, 10, 1),
            Preset::Connections => (1 << 30, 8, 1),
            Preset::WriteCpu => (1 << 30, 8, 0),
            Preset::CpuPerOp => (1 << 30, 15, 0),
        }
    }

    /// The scenario of this preset with `choices`.
    pub fn scenario(self, choices: &Choices) -> Scenario {
        let (rows, workloads) = match self {
            Preset::ReadAb => (read_ab_rows(choices), read_depths(choices)),
            Preset::CacheMiss => (cache_miss_rows(choices), cache_miss_workloads(choices)),
            Preset::Connections => (connections_rows(choices), connections_workloads(choices)),
            Preset::WriteCpu => (write_cpu_rows(choices), write_cpu_workloads(choices)),
            Preset::ReadCeiling => (read_ceiling_rows(choices), read_depths(choices)),
            Preset::CpuPerOp => (
                fresh_rows(
                    choices,
                    choices.memory_cache_bytes.unwrap_or(choices.size_bytes),
                ),
                cpu_per_op_workloads(choices),
            ),
        };
        let shared = rows.iter().any(|row| {
            matches!(
                row.server,
                Server::LaminaShared { .. } | Server::QemuNbdOnPoolFile | Server::DeviceOnPoolFile
            )
        });
        let shared_pool = shared.then(|| SharedPool {
            program: choices.builds[0].program.clone(),
            file_bytes: choices.size_bytes * SHARED_POOL_FILE_FACTOR + SHARED_POOL_HEADROOM_BYTES,
            extra_volumes: if self == Preset::ReadCeiling {
                vec!["holes".to_owned()]
            } else {
                vec![]
            },
        });
        Scenario {
            name: format!(
                "ab {}",
                clap::ValueEnum::to_possible_value(&self)
                    .expect("no skipped presets")
                    .get_name()
            ),
            rounds: choices.rounds,
            size_bytes: choices.size_bytes,
            workloads,
            shared_pool,
            // Ratios are to the first build's first row, not to a peer.
            reference: rows
                .iter()
                .find(|row| {
                    matches!(
                        row.server,
                        Server::LaminaShared { .. } | Server::LaminaFresh { .. }
                    )
                })
                .map(|row| row.label.clone()),
            rows,
        }
    }
}

impl Choices {
    /// lamina's configuration after the `[server]` line: the chosen `[server]`
    /// settings, then `[pool]` (with an embedded pool of `embedded_bytes`) and the cache.
    fn config(&self, memory_cache_bytes: u64, embedded_bytes: Option<u64>) -> String {
        let mut config: String = self
            .server_settings
            .iter()
            .map(|line| format!("{line}\n"))
            .collect();
        config.push_str("[pool]\n");
        if let Some(bytes) = embedded_bytes {
            config.push_str(&format!("embedded_size_bytes = {bytes}\n"));
        }
        config.push_str(&format!(
            "default_volume_bytes = {}\n[limits]\nmemory_cache_bytes = {memory_cache_bytes}\n",
            self.size_bytes
        ));
        config
    }

    fn warm_cache_bytes(&self) -> u64 {
        self.size_bytes * WARM_CACHE_FACTOR
    }

    fn shared(
        &self,
        build: &Build,
        suffix: &str,
        cache_bytes: u64,
        export: &str,
        preparation: Preparation,
    ) -> Row {
        Row {
            label: format!("{}{suffix}", build.label),
            server: Server::LaminaShared {
                program: build.program.clone(),
                config: self.config(cache_bytes, None),
                export: export.to_owned(),
            },
            preparation,
        }
    }

    fn step(&self, pattern: Pattern, iodepth: u32, jobs: u32) -> StepSpec {
        StepSpec {
            pattern,
            block_size_bytes: BLOCK_BYTES,
            iodepth,
            jobs,
            target_iops: None,
            runtime_seconds: self.runtime_seconds,
            ramp_seconds: self.ramp_seconds,
            region_bytes: self.size_bytes,
        }
    }

    fn workload(&self, name: impl Into<String>, pattern: Pattern, iodepth: u32) -> Workload {
        Workload {
            name: name.into(),
            step: self.step(pattern, iodepth, 1),
        }
    }
}

fn peer(plugin: &str, preparation: Preparation) -> Row {
    Row {
        label: format!("nbdkit-{plugin}"),
        server: Server::Nbdkit {
            plugin: plugin.to_owned(),
        },
        preparation,
    }
}

fn read_depths(choices: &Choices) -> Vec<Workload> {
    vec![
        choices.workload("randread32", Pattern::RandomRead, DEEP_QUEUE_DEPTH),
        choices.workload("randread1", Pattern::RandomRead, 1),
    ]
}

fn read_ab_rows(choices: &Choices) -> Vec<Row> {
    let mut rows = vec![peer("memory", Preparation::Fill)];
    for build in &choices.builds {
        for cache in &choices.caches {
            rows.push(match cache {
                Cache::Warm => choices.shared(
                    build,
                    "-warm",
                    choices.warm_cache_bytes(),
                    "default",
                    Preparation::WarmRead,
                ),
                Cache::Cold => choices.shared(build, "-cold", 0, "default", Preparation::Nothing),
            });
        }
    }
    rows
}

fn cache_miss_rows(choices: &Choices) -> Vec<Row> {
    let mut rows: Vec<Row> = choices
        .builds
        .iter()
        .map(|build| choices.shared(build, "", 0, "default", Preparation::Nothing))
        .collect();
    rows.push(Row {
        label: "device".to_owned(),
        server: Server::DeviceOnDataFile,
        preparation: Preparation::Nothing,
    });
    rows
}

fn mixed() -> Pattern {
    Pattern::RandomMix {
        read_percent: MIX_READ_PERCENT,
    }
}

fn cache_miss_workloads(choices: &Choices) -> Vec<Workload> {
    let mut workloads = read_depths(choices);
    workloads.push(choices.workload("rw7030", mixed(), DEEP_QUEUE_DEPTH));
    workloads.push(choices.workload("randwrite32", Pattern::RandomWrite, DEEP_QUEUE_DEPTH));
    workloads
}

fn connections_rows(choices: &Choices) -> Vec<Row> {
    choices
        .builds
        .iter()
        .map(|build| {
            choices.shared(
                build,
                "",
                choices.warm_cache_bytes(),
                "default",
                Preparation::WarmRead,
            )
        })
        .collect()
}

fn connections_workloads(choices: &Choices) -> Vec<Workload> {
    let mut workloads = Vec::new();
    for connections in &choices.connections {
        let depth = (DEEP_QUEUE_DEPTH / connections).max(1);
        for (name, pattern) in [
            ("randread", Pattern::RandomRead),
            ("randwrite", Pattern::RandomWrite),
        ] {
            workloads.push(Workload {
                name: format!("{name} connections={connections}"),
                step: choices.step(pattern, depth, *connections),
            });
        }
    }
    workloads
}

/// A fresh embedded pool per build and round, filled, with `memory_cache_bytes`.
fn fresh_rows(choices: &Choices, memory_cache_bytes: u64) -> Vec<Row> {
    choices
        .builds
        .iter()
        .map(|build| Row {
            label: build.label.clone(),
            server: Server::LaminaFresh {
                program: build.program.clone(),
                config: choices.config(
                    memory_cache_bytes,
                    Some(choices.size_bytes * FRESH_POOL_FACTOR),
                ),
            },
            preparation: Preparation::Fill,
        })
        .collect()
}

fn write_cpu_rows(choices: &Choices) -> Vec<Row> {
    let mut rows = fresh_rows(choices, 0);
    rows.push(peer("memory", Preparation::Fill));
    rows
}

fn write_cpu_workloads(choices: &Choices) -> Vec<Workload> {
    let (name, pattern) = if choices.mixed {
        ("rw7030", mixed())
    } else {
        ("randwrite", Pattern::RandomWrite)
    };
    (1..=choices.runs_per_pool)
        .map(|run| choices.workload(format!("{name} run={run}"), pattern, DEEP_QUEUE_DEPTH))
        .collect()
}

fn read_ceiling_rows(choices: &Choices) -> Vec<Row> {
    let build = &choices.builds[0];
    let nothing = Preparation::Nothing;
    vec![
        peer("null", nothing),
        peer("memory", Preparation::Fill),
        choices.shared(
            build,
            "-warm",
            choices.warm_cache_bytes(),
            "default",
            Preparation::WarmRead,
        ),
        choices.shared(
            build,
            "-holes",
            choices.warm_cache_bytes(),
            "holes",
            Preparation::WarmReadOfData,
        ),
        choices.shared(build, "-cold", 0, "default", nothing),
        Row {
            label: "device".to_owned(),
            server: Server::DeviceOnPoolFile,
            preparation: nothing,
        },
        Row {
            label: "qemu-nbd-cold".to_owned(),
            server: Server::QemuNbdOnPoolFile,
            preparation: nothing,
        },
    ]
}

fn cpu_per_op_workloads(choices: &Choices) -> Vec<Workload> {
    vec![
        choices.workload("randread", Pattern::RandomRead, DEEP_QUEUE_DEPTH),
        choices.workload("randwrite", Pattern::RandomWrite, DEEP_QUEUE_DEPTH),
        choices.workload("mixed7030", mixed(), DEEP_QUEUE_DEPTH),
    ]
}

#[cfg(test)]
mod tests {
    use clap::ValueEnum as _;

    use super::*;

    fn choices() -> Choices {
        let build = |label: &str| Build {
            label: label.to_owned(),
            program: PathBuf::from(format!("/bin/{label}")),
        };
        Choices {
            builds: vec![build("before"), build("after")],
            rounds: 2,
            runtime_seconds: 6,
            ramp_seconds: 1,
            size_bytes: 1 << 30,
            connections: vec![1, 4],
            caches: vec![Cache::Warm, Cache::Cold],
            runs_per_pool: 2,
            mixed: false,
            memory_cache_bytes: None,
            server_settings: vec!["volume_latency_histograms = false".to_owned()],
        }
    }

    fn rows(preset: Preset) -> Vec<String> {
        let scenario = preset.scenario(&choices());
        scenario.rows.into_iter().map(|row| row.label).collect()
    }

    fn workloads(preset: Preset) -> Vec<String> {
        let scenario = preset.scenario(&choices());
        let workloads = scenario.workloads.into_iter();
        workloads.map(|workload| workload.name).collect()
    }

    #[test]
    fn every_preset_is_rows_and_workloads_with_the_first_build_as_reference() {
        let choices = choices();
        for preset in Preset::value_variants() {
            let scenario = preset.scenario(&choices);
            assert!(!scenario.rows.is_empty() && !scenario.workloads.is_empty());
            assert!(
                scenario
                    .reference
                    .as_deref()
                    .is_some_and(|label| label.starts_with("before")),
                "{preset:?}: {:?}",
                scenario.reference
            );
            let shared = scenario.shared_pool.as_ref();
            assert!(shared.is_none_or(|pool| pool.program == choices.builds[0].program));
        }
    }

    #[test]
    fn read_ab_cache_miss_and_connections_keep_their_scripts_rows_and_workloads() {
        assert_eq!(
            rows(Preset::ReadAb),
            [
                "nbdkit-memory",
                "before-warm",
                "before-cold",
                "after-warm",
                "after-cold"
            ]
        );
        assert_eq!(rows(Preset::CacheMiss), ["before", "after", "device"]);
        assert_eq!(
            workloads(Preset::CacheMiss),
            ["randread32", "randread1", "rw7030", "randwrite32"]
        );
        assert_eq!(
            workloads(Preset::Connections),
            [
                "randread connections=1",
                "randwrite connections=1",
                "randread connections=4",
                "randwrite connections=4"
            ]
        );
        let connections = Preset::Connections.scenario(&choices());
        let depths: Vec<(u32, u32)> = connections
            .workloads
            .iter()
            .map(|workload| (workload.step.jobs, workload.step.iodepth))
            .collect();
        assert_eq!(depths, [(1, 32), (1, 32), (4, 8), (4, 8)]);
    }

    #[test]
    fn write_cpu_read_ceiling_and_cpu_per_op_keep_their_scripts_setup() {
        assert_eq!(rows(Preset::WriteCpu), ["before", "after", "nbdkit-memory"]);
        assert_eq!(
            workloads(Preset::WriteCpu),
            ["randwrite run=1", "randwrite run=2"]
        );
        assert_eq!(
            rows(Preset::ReadCeiling),
            [
                "nbdkit-null",
                "nbdkit-memory",
                "before-warm",
                "before-holes",
                "before-cold",
                "device",
                "qemu-nbd-cold"
            ]
        );
        let Server::LaminaFresh { config, .. } =
            &Preset::CpuPerOp.scenario(&choices()).rows[0].server
        else {
            panic!("cpu-per-op runs a fresh pool");
        };
        assert!(config.starts_with("volume_latency_histograms = false\n[pool]\n"));
        assert!(config.contains("embedded_size_bytes = 4294967296\n"));
        assert!(config.ends_with("memory_cache_bytes = 1073741824\n"));
    }
}
