//! `lamina bench write-amplification`: the cleaner's write amplification (device bytes
//! written ÷ client bytes written) under 4 KiB random overwrites, measured through a
//! real client: the `lamina` daemon on a file-backed pool, written by fio over NBD.
//!
//! Each cell (a live-data fraction and a workload) gets a fresh pool: the volume is
//! `live × (capacity − reserved)`, filled sequentially, overwritten at random for the
//! warm-up passes so that the cleaner reaches its steady state, then measured over
//! further passes between two readings of `lamina pool status`. The figure is trusted
//! only when the pool's count of client bytes in that window equals what fio says it
//! wrote; otherwise the run fails. Uniform offsets are fio's `random`, skewed ones its
//! `zipf:THETA` (fio maps Zipf ranks to blocks by a hash modulo the block count, so a
//! large share of blocks is never rewritten: that is fio's definition of the workload).
//! Beside uniform cells the analytic bound of a greedy cleaner is printed.

use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::{Args, ValueEnum};
use serde::Serialize;

use crate::convert::saturating_u64;
use crate::fio;
use crate::harness::arguments::{CommonArgs, work_directory_in};
use crate::lamina_cli::LaminaCli;
use crate::process::check_interrupted;
use crate::servers::{RunningServer, serve_lamina_data};
use lamina_api::size::parse_size;
use lamina_api::{PoolStatus, VolumeInfo};

/// Client block size of the overwrites, in bytes.
const BLOCK_SIZE_BYTES: u64 = 4096;

/// Volume sizes are rounded down to a multiple of this, in bytes.
const VOLUME_ALIGNMENT_BYTES: u64 = 1 << 20;

/// Block size of the sequential fill, in bytes (the volume is a multiple of it).
const FILL_BLOCK_SIZE_BYTES: u64 = 1 << 20;

/// In-flight requests of the sequential fill.
const FILL_IODEPTH: u32 = 4;

/// The pool and fio count the same writes, so they must agree; this share of the
/// client bytes is allowed between them before the figure is refused.
const CLIENT_BYTES_TOLERANCE_FRACTION: f64 = 0.001;

/// The name of the measured volume (and its NBD export).
const VOLUME_NAME: &str = "wa";

/// Errors that make a write-amplification figure impossible or untrustworthy.
#[derive(Debug, thiserror::Error)]
pub enum WriteAmplificationError {
    #[error("lamina binary {} not found (set --lamina-bin or LAMINA_BIN)", .path.display())]
    LaminaMissing { path: PathBuf },
    #[error("--live {live} is not a fraction strictly between 0 and 1")]
    LiveOutOfRange { live: f64 },
    #[error("--{name} {value} must be {requirement}")]
    BadPasses {
        name: &'static str,
        value: f64,
        requirement: &'static str,
    },
    #[error(
        "live {live} of {usable_bytes} usable bytes is less than one MiB: use a larger --pool-size"
    )]
    VolumeTooSmall { live: f64, usable_bytes: u64 },
    #[error("the pool failed during the run: {reason}")]
    PoolFailed { reason: String },
    #[error(
        "the pool counted {pool_bytes} client bytes in the measured window but fio wrote {fio_bytes}: \
         the figure would not describe fio's writes"
    )]
    ClientBytesMismatch { pool_bytes: u64, fio_bytes: u64 },
    #[error("fio wrote nothing in the measured window")]
    NothingWritten,
}

/// The access pattern of the overwrites.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// Every block equally likely (fio's `random`).
    Uniform,
    /// Zipf-skewed block popularity (fio's `zipf:THETA`).
    Zipf,
}

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Workload::Uniform => "uniform",
            Workload::Zipf => "zipf",
        }
    }

    /// fio's `--random_distribution` value.
    fn fio_distribution(self, zipf_theta: f64) -> String {
        match self {
            Workload::Uniform => "random".to_owned(),
            Workload::Zipf => format!("zipf:{zipf_theta}"),
        }
    }
}

/// Arguments of `lamina bench write-amplification`.
#[derive(Debug, Clone, Args)]
pub struct WriteAmplificationArgs {
    /// Size of each cell's pool file (e.g. 1G, 256M).
    #[arg(long, value_parser = parse_size, default_value = "1G")]
    pub pool_size: u64,
    /// Segment size of the pool: the unit of cleaning.
    #[arg(long, value_parser = parse_size, default_value = "1M")]
    pub segment_size: u64,
    /// Live-data fractions of the usable space (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = vec![0.5, 0.7, 0.85])]
    pub live: Vec<f64>,
    /// Workloads (comma-separated).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = vec![Workload::Uniform, Workload::Zipf])]
    pub workloads: Vec<Workload>,
    /// Skew of the zipf workload.
    #[arg(long, default_value_t = 0.99)]
    pub zipf_theta: f64,
    /// Volume sizes of random writes before measuring (fractions allowed).
    #[arg(long, default_value_t = 2.0)]
    pub warm_up_passes: f64,
    /// Volume sizes of random writes measured (fractions allowed).
    #[arg(long, default_value_t = 2.0)]
    pub passes: f64,
    /// In-flight 4 KiB writes.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
    pub iodepth: u32,
    /// Where the cells' pools go; their pool files are kept (default: a temporary
    /// directory, removed).
    #[arg(long)]
    pub directory: Option<PathBuf>,
    #[command(flatten)]
    pub common: CommonArgs,
}

impl WriteAmplificationArgs {
    fn check(&self) -> Result<(), WriteAmplificationError> {
        if let Some(live) = self
            .live
            .iter()
            .copied()
            .find(|live| !(*live > 0.0 && *live < 1.0))
        {
            return Err(WriteAmplificationError::LiveOutOfRange { live });
        }
        if !(self.passes > 0.0 && self.passes.is_finite()) {
            return Err(WriteAmplificationError::BadPasses {
                name: "passes",
                value: self.passes,
                requirement: "positive",
            });
        }
        if !(self.warm_up_passes >= 0.0 && self.warm_up_passes.is_finite()) {
            return Err(WriteAmplificationError::BadPasses {
                name: "warm-up-passes",
                value: self.warm_up_passes,
                requirement: "zero or positive",
            });
        }
        Ok(())
    }
}

/// The settings every cell shared.
#[derive(Debug, Clone, Serialize)]
pub struct Settings {
    pub pool_size_bytes: u64,
    pub segment_size_bytes: u64,
    pub block_size_bytes: u64,
    pub zipf_theta: f64,
    pub warm_up_passes: f64,
    pub passes: f64,
    pub iodepth: u32,
}

/// One cell's figures. Byte and block counts are of the measured window.
#[derive(Debug, Clone, Serialize)]
pub struct CellResult {
    pub live_fraction: f64,
    pub workload: Workload,
    /// fio's `--random_distribution`.
    pub random_distribution: String,
    pub capacity_bytes: u64,
    pub reserved_bytes: u64,
    pub volume_size_bytes: u64,
    /// Client bytes written, as the pool counted them.
    pub client_bytes_written: u64,
    /// Bytes written, as fio reported them.
    pub fio_bytes_written: u64,
    pub device_bytes_written: u64,
    pub cleaner_relocated_blocks: u64,
    /// Device bytes ÷ client bytes.
    pub write_amplification: f64,
    /// Relocated bytes ÷ client bytes: the cleaner's share of the amplification.
    pub relocated_per_client_block: f64,
    /// Checkpoints the pool wrote in the window (part of the device bytes).
    pub checkpoint_count: u64,
    /// Write IOPS fio reached in the measured window.
    pub client_iops: f64,
    pub measured_seconds: f64,
    /// Write amplification of a greedy cleaner under uniform overwrites at this live
    /// fraction (analytic; uniform cells only).
    pub greedy_bound: Option<f64>,
}

/// What `lamina bench write-amplification --json` prints.
#[derive(Debug, Clone, Serialize)]
pub struct WriteAmplificationReport {
    pub fio_version: String,
    pub settings: Settings,
    pub cells: Vec<CellResult>,
}

/// Write amplification of a greedy cleaner under uniform random overwrites at
/// `live` utilisation (the model crate's bound, the one the engine is measured
/// against everywhere).
pub fn greedy_bound(live: f64) -> f64 {
    lamina_model::bounds::greedy_write_amplification(live)
}

/// The volume of a cell: `live` of the usable space, rounded down to whole MiB.
pub fn volume_size_bytes(
    live: f64,
    capacity_bytes: u64,
    reserved_bytes: u64,
) -> Result<u64, WriteAmplificationError> {
    let usable_bytes = capacity_bytes.saturating_sub(reserved_bytes);
    let size = saturating_u64((live * usable_bytes as f64).floor()) / VOLUME_ALIGNMENT_BYTES
        * VOLUME_ALIGNMENT_BYTES;
    if size == 0 {
        return Err(WriteAmplificationError::VolumeTooSmall { live, usable_bytes });
    }
    Ok(size)
}

/// Bytes of `passes` volume sizes, rounded down to whole blocks (at least one).
pub fn pass_bytes(volume_size_bytes: u64, passes: f64) -> u64 {
    let bytes = saturating_u64((passes * volume_size_bytes as f64).floor()) / BLOCK_SIZE_BYTES
        * BLOCK_SIZE_BYTES;
    bytes.max(BLOCK_SIZE_BYTES)
}

/// fio's arguments (engine and output format aside) for `io_bytes` of 4 KiB random
/// writes over the first `volume_size_bytes` of the export.
pub fn random_write_arguments(
    volume_size_bytes: u64,
    io_bytes: u64,
    distribution: &str,
    iodepth: u32,
) -> Vec<String> {
    vec![
        "--name=write-amplification".to_owned(),
        "--rw=randwrite".to_owned(),
        format!("--bs={BLOCK_SIZE_BYTES}"),
        format!("--size={volume_size_bytes}"),
        format!("--io_size={io_bytes}"),
        format!("--iodepth={iodepth}"),
        // Offsets are drawn independently (a random map would turn the passes into
        // permutations) and differ from run to run.
        "--norandommap".to_owned(),
        "--randrepeat=0".to_owned(),
        format!("--random_distribution={distribution}"),
        // The flush at the end makes the pool seal what it holds before the status
        // is read, so the window's device writes belong to its client writes.
        "--end_fsync=1".to_owned(),
    ]
}

/// fio's arguments for one sequential pass of 1 MiB writes over the volume.
fn fill_arguments(volume_size_bytes: u64) -> Vec<String> {
    vec![
        "--name=fill".to_owned(),
        "--rw=write".to_owned(),
        format!("--bs={FILL_BLOCK_SIZE_BYTES}"),
        format!("--size={volume_size_bytes}"),
        format!("--iodepth={FILL_IODEPTH}"),
        "--end_fsync=1".to_owned(),
    ]
}

/// What fio reported of one write phase.
struct FioWrites {
    bytes: u64,
    iops: f64,
}

fn run_fio(fio_program: &str, uri: &str, arguments: &[String]) -> anyhow::Result<FioWrites> {
    let report = crate::fio::run(fio_program, uri, arguments)?;
    let job = report.job()?;
    Ok(FioWrites {
        bytes: job.write.io_bytes,
        iops: job.write.iops,
    })
}

/// The counters of `lamina pool status --json` this benchmark reads.
#[derive(Debug, Clone, Copy)]
struct PoolCounters {
    capacity_bytes: u64,
    reserved_bytes: u64,
    client_bytes_written: u64,
    device_bytes_written: u64,
    cleaner_relocated_blocks: u64,
    checkpoint_sequence: u64,
}

impl PoolCounters {
    fn from_status(status: &PoolStatus) -> Result<Self, WriteAmplificationError> {
        if let Some(reason) = &status.failed {
            return Err(WriteAmplificationError::PoolFailed {
                reason: reason.clone(),
            });
        }
        Ok(Self {
            capacity_bytes: status.capacity_bytes,
            reserved_bytes: status.reserved_bytes,
            client_bytes_written: status.client_bytes_written,
            device_bytes_written: status.device_bytes_written,
            cleaner_relocated_blocks: status.cleaner_relocated_blocks,
            checkpoint_sequence: status.checkpoint_sequence,
        })
    }

    fn read(program: &Path, data: &Path) -> anyhow::Result<Self> {
        let cli = LaminaCli::new(program, data);
        Ok(Self::from_status(
            &cli.json(&["pool", "status", "--json"])?,
        )?)
    }
}

/// What happened in the measured window.
#[derive(Debug, Clone, Copy, PartialEq)]
struct WindowFigures {
    client_bytes: u64,
    device_bytes: u64,
    relocated_blocks: u64,
    write_amplification: f64,
    relocated_per_client_block: f64,
    checkpoint_count: u64,
}

/// The figures of a measured window from the counters at its two ends and fio's count.
fn window_figures(
    before: PoolCounters,
    after: PoolCounters,
    fio_bytes: u64,
) -> Result<WindowFigures, WriteAmplificationError> {
    let client_bytes = after.client_bytes_written - before.client_bytes_written;
    let device_bytes = after.device_bytes_written - before.device_bytes_written;
    let relocated_blocks = after.cleaner_relocated_blocks - before.cleaner_relocated_blocks;
    if fio_bytes == 0 {
        return Err(WriteAmplificationError::NothingWritten);
    }
    let tolerance_bytes =
        saturating_u64((fio_bytes as f64 * CLIENT_BYTES_TOLERANCE_FRACTION).floor());
    if client_bytes.abs_diff(fio_bytes) > tolerance_bytes {
        return Err(WriteAmplificationError::ClientBytesMismatch {
            pool_bytes: client_bytes,
            fio_bytes,
        });
    }
    Ok(WindowFigures {
        client_bytes,
        device_bytes,
        relocated_blocks,
        write_amplification: device_bytes as f64 / client_bytes as f64,
        relocated_per_client_block: (relocated_blocks * BLOCK_SIZE_BYTES) as f64
            / client_bytes as f64,
        checkpoint_count: after.checkpoint_sequence - before.checkpoint_sequence,
    })
}

/// Everything one cell needs.
struct CellPlan<'a> {
    arguments: &'a WriteAmplificationArgs,
    program: &'a Path,
    live: f64,
    workload: Workload,
    label: String,
}

impl CellPlan<'_> {
    fn progress(&self, message: &str) {
        eprintln!("{}: {message}", self.label);
    }

    /// Creates the pool and volume in `directory`, serves it, writes and measures.
    fn run(&self, directory: &Path) -> anyhow::Result<CellResult> {
        let arguments = self.arguments;
        // The server's directory (configuration, log, data directory) is removed when
        // it stops; the pool file lives beside it so that --directory can keep it.
        let server_directory = directory.join("server");
        let data = server_directory.join("data");
        std::fs::create_dir_all(&data)?;
        let pool_file = directory.join("pool.img");
        let flash = format!("{}:{}", pool_file.display(), arguments.pool_size);
        let segment = arguments.segment_size.to_string();
        self.progress(&format!(
            "creating a {} MiB pool",
            arguments.pool_size >> 20
        ));
        let cli = LaminaCli::new(self.program, &data);
        let created = PoolCounters::from_status(&cli.json(&[
            "pool",
            "create",
            "--flash",
            &flash,
            "--segment-size",
            &segment,
            "--json",
        ])?)?;
        let volume_bytes =
            volume_size_bytes(self.live, created.capacity_bytes, created.reserved_bytes)?;
        let _: VolumeInfo = cli.json(&[
            "volume",
            "create",
            VOLUME_NAME,
            &volume_bytes.to_string(),
            "--json",
        ])?;
        let server = serve_lamina_data(self.program, &server_directory, &data, "", VOLUME_NAME)?;
        let result = self.measure(&server, &data, created, volume_bytes);
        server.stop();
        result
    }

    fn measure(
        &self,
        server: &RunningServer,
        data: &Path,
        created: PoolCounters,
        volume_bytes: u64,
    ) -> anyhow::Result<CellResult> {
        let arguments = self.arguments;
        let fio = arguments.common.fio.as_str();
        let distribution = self.workload.fio_distribution(arguments.zipf_theta);
        let mebibytes = |bytes: u64| format!("{:.0} MiB", bytes as f64 / f64::from(1 << 20));
        let timed = |message: String, phase: &dyn Fn() -> anyhow::Result<FioWrites>| {
            check_interrupted()?;
            self.progress(&message);
            let start = Instant::now();
            let writes = phase()?;
            let seconds = start.elapsed().as_secs_f64();
            self.progress(&format!(
                "  done in {seconds:.1} s ({:.0} write IOPS, {:.0} MiB/s)",
                writes.iops,
                writes.bytes as f64 / f64::from(1 << 20) / seconds
            ));
            anyhow::Ok((writes, seconds))
        };
        timed(
            format!(
                "filling the {} volume sequentially",
                mebibytes(volume_bytes)
            ),
            &|| run_fio(fio, &server.uri, &fill_arguments(volume_bytes)),
        )?;
        let random_writes = |phase: &str, io_bytes: u64| {
            let fio_arguments =
                random_write_arguments(volume_bytes, io_bytes, &distribution, arguments.iodepth);
            timed(
                format!(
                    "{phase}: {} of 4 KiB {distribution} writes",
                    mebibytes(io_bytes)
                ),
                &|| run_fio(fio, &server.uri, &fio_arguments),
            )
        };
        if arguments.warm_up_passes > 0.0 {
            random_writes(
                "warming up",
                pass_bytes(volume_bytes, arguments.warm_up_passes),
            )?;
        }
        let before = PoolCounters::read(self.program, data)?;
        let (writes, measured_seconds) =
            random_writes("measuring", pass_bytes(volume_bytes, arguments.passes))?;
        let after = PoolCounters::read(self.program, data)?;
        let window = window_figures(before, after, writes.bytes)?;
        self.progress(&format!(
            "  write amplification {:.2} (relocated per client block {:.2})",
            window.write_amplification, window.relocated_per_client_block
        ));
        Ok(CellResult {
            live_fraction: self.live,
            workload: self.workload,
            random_distribution: distribution,
            capacity_bytes: created.capacity_bytes,
            reserved_bytes: created.reserved_bytes,
            volume_size_bytes: volume_bytes,
            client_bytes_written: window.client_bytes,
            fio_bytes_written: writes.bytes,
            device_bytes_written: window.device_bytes,
            cleaner_relocated_blocks: window.relocated_blocks,
            write_amplification: window.write_amplification,
            relocated_per_client_block: window.relocated_per_client_block,
            checkpoint_count: window.checkpoint_count,
            client_iops: writes.iops,
            measured_seconds,
            greedy_bound: (self.workload == Workload::Uniform).then(|| greedy_bound(self.live)),
        })
    }
}

/// Measures every cell and returns the report (the CLI prints it; tests inspect it).
pub fn measure(arguments: &WriteAmplificationArgs) -> anyhow::Result<WriteAmplificationReport> {
    arguments.check()?;
    fio::check_nbd_engine(&arguments.common.fio)?;
    let version = fio::version(&arguments.common.fio)?;
    let program = arguments.common.lamina_program();
    if !program.is_file() {
        return Err(WriteAmplificationError::LaminaMissing { path: program }.into());
    }
    let mut workloads: Vec<Workload> = Vec::new();
    for workload in &arguments.workloads {
        if !workloads.contains(workload) {
            workloads.push(*workload);
        }
    }
    if let Some(directory) = &arguments.directory {
        std::fs::create_dir_all(directory)?;
    }
    let cell_count = arguments.live.len() * workloads.len();
    let mut cells = Vec::with_capacity(cell_count);
    for &live in &arguments.live {
        for &workload in &workloads {
            check_interrupted()?;
            let plan = CellPlan {
                arguments,
                program: &program,
                live,
                workload,
                label: format!(
                    "[{}/{cell_count}] live {live} {}",
                    cells.len() + 1,
                    workload.name()
                ),
            };
            // A fresh pool per cell; with --directory its pool file is kept.
            let directory = work_directory_in(
                arguments
                    .directory
                    .as_deref()
                    .or(arguments.common.work_dir.as_deref()),
            )?;
            let result = plan.run(directory.path());
            if arguments.directory.is_some() {
                let kept = directory.keep();
                plan.progress(&format!("pool file kept in {}", kept.display()));
            }
            cells.push(result?);
        }
    }
    Ok(WriteAmplificationReport {
        fio_version: version,
        settings: Settings {
            pool_size_bytes: arguments.pool_size,
            segment_size_bytes: arguments.segment_size,
            block_size_bytes: BLOCK_SIZE_BYTES,
            zipf_theta: arguments.zipf_theta,
            warm_up_passes: arguments.warm_up_passes,
            passes: arguments.passes,
            iodepth: arguments.iodepth,
        },
        cells,
    })
}

impl WriteAmplificationReport {
    /// The human-readable table.
    pub fn table(&self) -> String {
        let settings = &self.settings;
        let mut out = format!(
            "write amplification: {} MiB pool, {} KiB segments, 4 KiB random writes at QD{}, \
             {} warm-up + {} measured passes, lamina daemon over NBD, {}\n",
            settings.pool_size_bytes >> 20,
            settings.segment_size_bytes >> 10,
            settings.iodepth,
            settings.warm_up_passes,
            settings.passes,
            self.fio_version
        );
        out.push_str(&format!(
            "{:>6} {:<10} {:>10} {:>8} {:>11} {:>8} {:>10} {:>11} {:>11} {:>12}\n",
            "live",
            "workload",
            "volume",
            "WA",
            "relocated/",
            "greedy",
            "client",
            "client",
            "device",
            "checkpoints"
        ));
        out.push_str(&format!(
            "{:>6} {:<10} {:>10} {:>8} {:>11} {:>8} {:>10} {:>11} {:>11} {:>12}\n",
            "", "", "MiB", "", "client blk", "bound", "IOPS", "MiB", "MiB", ""
        ));
        let mebibytes = |bytes: u64| format!("{:.0}", bytes as f64 / f64::from(1 << 20));
        for cell in &self.cells {
            out.push_str(&format!(
                "{:>6.2} {:<10} {:>10} {:>8.2} {:>11.2} {:>8} {:>10.0} {:>11} {:>11} {:>12}\n",
                cell.live_fraction,
                cell.random_distribution,
                mebibytes(cell.volume_size_bytes),
                cell.write_amplification,
                cell.relocated_per_client_block,
                cell.greedy_bound
                    .map_or_else(|| "-".to_owned(), |bound| format!("{bound:.2}")),
                cell.client_iops,
                mebibytes(cell.client_bytes_written),
                mebibytes(cell.device_bytes_written),
                cell.checkpoint_count,
            ));
        }
        out
    }
}

/// Runs `lamina bench write-amplification` and prints the table or the JSON.
pub fn run_write_amplification(arguments: &WriteAmplificationArgs) -> anyhow::Result<()> {
    crate::process::become_subreaper();
    let start = Instant::now();
    let report = measure(arguments)?;
    arguments
        .common
        .output
        .publish(&report, &report.table(), None)?;
    eprintln!("elapsed {:.0} s", start.elapsed().as_secs_f64());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counters(client: u64, device: u64, relocated: u64, checkpoint: u64) -> PoolCounters {
        PoolCounters {
            capacity_bytes: 0,
            reserved_bytes: 0,
            client_bytes_written: client,
            device_bytes_written: device,
            cleaner_relocated_blocks: relocated,
            checkpoint_sequence: checkpoint,
        }
    }

    #[test]
    fn greedy_bound_matches_the_known_values() {
        assert!((greedy_bound(0.85) - 3.52).abs() < 0.01);
        assert!(greedy_bound(0.5) < greedy_bound(0.7));
        assert!(greedy_bound(0.5) > 1.0);
    }

    #[test]
    fn volume_is_the_live_share_of_usable_space_in_whole_mebibytes() {
        let mebibyte = 1 << 20;
        assert_eq!(
            volume_size_bytes(0.5, 60 * mebibyte, 7 * mebibyte).unwrap(),
            26 * mebibyte
        );
        assert!(matches!(
            volume_size_bytes(0.5, 2 * mebibyte, mebibyte),
            Err(WriteAmplificationError::VolumeTooSmall { .. })
        ));
    }

    #[test]
    fn passes_are_whole_blocks_and_never_empty() {
        assert_eq!(pass_bytes(1 << 20, 2.0), 2 << 20);
        assert_eq!(pass_bytes(1 << 20, 0.5), 1 << 19);
        assert_eq!(pass_bytes(1 << 20, 1e-9), BLOCK_SIZE_BYTES);
        assert_eq!(pass_bytes(10 << 20, 0.3) % BLOCK_SIZE_BYTES, 0);
    }

    #[test]
    fn random_writes_use_fio_distribution_names() {
        let arguments = random_write_arguments(
            64 << 20,
            128 << 20,
            &Workload::Zipf.fio_distribution(0.99),
            16,
        );
        assert!(arguments.contains(&"--random_distribution=zipf:0.99".to_owned()));
        assert!(arguments.contains(&"--io_size=134217728".to_owned()));
        assert!(arguments.contains(&"--norandommap".to_owned()));
        assert_eq!(Workload::Uniform.fio_distribution(0.99), "random");
    }

    #[test]
    fn window_figures_are_deltas_and_refuse_a_client_byte_mismatch() {
        let before = counters(1_000_000, 2_000_000, 10, 4);
        let after = counters(1_000_000 + 409_600, 2_000_000 + 819_200, 110, 7);
        let window = window_figures(before, after, 409_600).unwrap();
        assert_eq!(
            (
                window.client_bytes,
                window.device_bytes,
                window.relocated_blocks
            ),
            (409_600, 819_200, 100)
        );
        assert!((window.write_amplification - 2.0).abs() < 1e-12);
        assert!((window.relocated_per_client_block - 1.0).abs() < 1e-12);
        assert_eq!(window.checkpoint_count, 3);
        assert!(matches!(
            window_figures(before, after, 204_800),
            Err(WriteAmplificationError::ClientBytesMismatch { .. })
        ));
        assert!(matches!(
            window_figures(before, after, 0),
            Err(WriteAmplificationError::NothingWritten)
        ));
    }

    #[test]
    fn live_fractions_outside_zero_to_one_are_refused() {
        let mut arguments = WriteAmplificationArgs {
            pool_size: 64 << 20,
            segment_size: 1 << 20,
            live: vec![0.5, 1.0],
            workloads: vec![Workload::Uniform],
            zipf_theta: 0.99,
            warm_up_passes: 1.0,
            passes: 1.0,
            iodepth: 16,
            directory: None,
            common: CommonArgs::default(),
        };
        assert!(matches!(
            arguments.check(),
            Err(WriteAmplificationError::LiveOutOfRange { live }) if live == 1.0
        ));
        arguments.live = vec![0.5];
        arguments.passes = 0.0;
        assert!(matches!(
            arguments.check(),
            Err(WriteAmplificationError::BadPasses { .. })
        ));
    }
}
