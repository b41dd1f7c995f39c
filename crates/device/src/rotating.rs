//! A rotating-disk latency model wrapped around any device, so that the
//! difference between flash and a capacity disk can be measured on any machine
//! (the capacity tier of issue 7 runs on it in tests and benchmarks). Data goes to
//! and comes from the inner device unchanged; only the timing is modelled.
//!
//! Each request costs a seek (a function of the distance the head travels:
//! track-to-track for the shortest move, full-stroke across the whole disk,
//! square-root shaped in between, as the head's acceleration phase dominates short
//! seeks), a rotational latency (uniformly random up to one revolution, from a
//! seeded generator so runs repeat), and a transfer at the sustained media rate. A
//! request that starts exactly where the previous one ended pays neither seek nor
//! rotation, which is what makes sequential streams fast on a real disk.
//!
//! There is one head, so requests are served one at a time in arrival order. The
//! device keeps the instant at which the head becomes free; a new request starts
//! at that instant (or now, if the head is idle) and completes one service time
//! later. The caller sleeps until that completion instant (up to 1 ms early, as
//! tokio's timer counts whole milliseconds), so queued requests accumulate delay exactly as on a real
//! disk rather than each sleeping on its own.
//! Time is tokio time, so tests can pause the clock and run the model instantly
//! and deterministically.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::{AlignedBuffer, BlockDevice, DeviceError};

/// Tokio's timer fires at the first whole-millisecond tick at or after a deadline,
/// so a caller sleeping until the exact completion would wake up to 1 ms late, and
/// a caller issuing its next request only then would leave the head idle: a stream
/// of small sequential requests would lose half or more of its modelled rate.
/// Sleeping until one tick before the completion wakes the caller within the last
/// millisecond before it instead, never late; the head's own accounting stays
/// exact, because an early caller's next request simply queues behind the busy
/// head. The price is that a request may be seen to complete up to 1 ms early.
const TIMER_TICK: Duration = Duration::from_millis(1);

/// Waits until at most one tick before `completion` (see [`TIMER_TICK`]).
async fn wait_until(completion: Instant) {
    if completion > Instant::now() + TIMER_TICK {
        tokio::time::sleep_until(completion - TIMER_TICK).await;
    }
}

/// The parameters of the model. Defaults describe a 7,200 rpm SATA capacity disk.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct RotatingDiskModel {
    /// Spindle speed; one revolution at 7,200 rpm takes 8.33 ms.
    pub rotation_rpm: u32,
    /// Seek time for the shortest move (to the neighbouring track).
    pub seek_track_to_track_ms: f64,
    /// Seek time across the whole stroke (first to last byte of the disk).
    pub seek_full_stroke_ms: f64,
    /// Sustained media transfer rate.
    pub transfer_bytes_per_second: u64,
    /// The byte span a full-stroke seek covers. `None` means the wrapped device's
    /// size, so that a small test device behaves like a whole disk; a figure larger
    /// than the device makes it behave like a short-stroked part of a big disk.
    pub full_stroke_bytes: Option<u64>,
    /// Requests accepted by the disk at once (like a SATA disk's command queue);
    /// further callers wait for a slot before they are even queued at the head.
    pub queue_depth_max: usize,
    /// Seed of the rotational-latency generator, so runs repeat exactly.
    pub seed: u64,
}

impl Default for RotatingDiskModel {
    fn default() -> Self {
        Self {
            rotation_rpm: 7_200,
            seek_track_to_track_ms: 0.5,
            seek_full_stroke_ms: 15.0,
            transfer_bytes_per_second: 180_000_000,
            full_stroke_bytes: None,
            queue_depth_max: 32,
            seed: 0x5eed_d15c,
        }
    }
}

impl RotatingDiskModel {
    /// The time of one full revolution (the largest rotational latency).
    pub fn revolution(&self) -> Duration {
        assert!(self.rotation_rpm > 0, "rotation_rpm must be positive");
        Duration::from_secs_f64(60.0 / f64::from(self.rotation_rpm))
    }

    /// The seek time for moving the head `distance_bytes` over a stroke of
    /// `stroke_bytes`: zero for no movement, track-to-track plus a square-root
    /// share of the difference to full-stroke otherwise. Uniformly random seeks
    /// average track-to-track + 8/15 of the difference (8.2 ms with the defaults).
    pub fn seek_time(&self, distance_bytes: u64, stroke_bytes: u64) -> Duration {
        if distance_bytes == 0 {
            return Duration::ZERO;
        }
        let fraction = (distance_bytes as f64 / stroke_bytes.max(1) as f64).min(1.0);
        let span_ms = (self.seek_full_stroke_ms - self.seek_track_to_track_ms).max(0.0);
        Duration::from_secs_f64((self.seek_track_to_track_ms + span_ms * fraction.sqrt()) / 1e3)
    }

    /// The time to move `length_bytes` under the head at the sustained rate.
    pub fn transfer_time(&self, length_bytes: u64) -> Duration {
        assert!(
            self.transfer_bytes_per_second > 0,
            "transfer_bytes_per_second must be positive"
        );
        Duration::from_secs_f64(length_bytes as f64 / self.transfer_bytes_per_second as f64)
    }
}

/// What the model has done so far, for statistics and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct RotatingDiskStatistics {
    /// Reads and writes served.
    pub requests: u64,
    /// Requests that started where the previous one ended (no seek, no rotation).
    pub sequential_requests: u64,
    /// Sum of modelled service times: how long the head was busy.
    pub busy_time: Duration,
    /// Sum of modelled seek times.
    pub seek_time: Duration,
    /// Sum of modelled rotational latencies.
    pub rotation_time: Duration,
}

struct Head {
    /// When the head finishes the last request accepted so far.
    free_at: Instant,
    /// The byte after the end of the last request: where the head is.
    position_bytes: u64,
    rng: SmallRng,
    statistics: RotatingDiskStatistics,
}

/// See the module documentation.
pub struct RotatingDiskDevice {
    inner: Arc<dyn BlockDevice>,
    name: String,
    model: RotatingDiskModel,
    stroke_bytes: u64,
    queue_slots: Semaphore,
    head: Mutex<Head>,
}

impl RotatingDiskDevice {
    pub fn new(inner: Arc<dyn BlockDevice>, model: RotatingDiskModel) -> Self {
        assert!(
            model.queue_depth_max > 0,
            "queue_depth_max must be positive"
        );
        assert!(
            model.seek_track_to_track_ms >= 0.0 && model.seek_full_stroke_ms >= 0.0,
            "seek times must not be negative"
        );
        // Validate the remaining parameters once, here, rather than on the hot path.
        let _ = model.revolution();
        let _ = model.transfer_time(0);
        let name = format!("rotating({})", inner.name());
        let stroke_bytes = model.full_stroke_bytes.unwrap_or(inner.size_bytes()).max(1);
        Self {
            name,
            stroke_bytes,
            queue_slots: Semaphore::new(model.queue_depth_max),
            head: Mutex::new(Head {
                free_at: Instant::now(),
                position_bytes: 0,
                rng: SmallRng::seed_from_u64(model.seed),
                statistics: RotatingDiskStatistics::default(),
            }),
            inner,
            model,
        }
    }

    pub fn model(&self) -> &RotatingDiskModel {
        &self.model
    }

    pub fn inner(&self) -> &Arc<dyn BlockDevice> {
        &self.inner
    }

    pub fn statistics(&self) -> RotatingDiskStatistics {
        self.head
            .lock()
            .expect("rotating disk head lock")
            .statistics
    }

    /// Queues a request of `length_bytes` at `offset` behind every request accepted
    /// before it and returns the instant the head finishes it.
    fn schedule(&self, offset: u64, length_bytes: u64) -> Instant {
        let mut head = self.head.lock().expect("rotating disk head lock");
        let start = head.free_at.max(Instant::now());
        let sequential = offset == head.position_bytes;
        let (seek, rotation) = if sequential {
            (Duration::ZERO, Duration::ZERO)
        } else {
            let seek = self
                .model
                .seek_time(offset.abs_diff(head.position_bytes), self.stroke_bytes);
            let rotation = self
                .model
                .revolution()
                .mul_f64(head.rng.random_range(0.0..1.0));
            (seek, rotation)
        };
        let service = seek + rotation + self.model.transfer_time(length_bytes);
        let completion = start + service;
        head.free_at = completion;
        head.position_bytes = offset + length_bytes;
        let statistics = &mut head.statistics;
        statistics.requests += 1;
        statistics.sequential_requests += u64::from(sequential);
        statistics.busy_time += service;
        statistics.seek_time += seek;
        statistics.rotation_time += rotation;
        completion
    }
}

#[async_trait::async_trait]
impl BlockDevice for RotatingDiskDevice {
    fn name(&self) -> &str {
        &self.name
    }

    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }

    fn read(&self, offset: u64, length: usize) -> crate::DeviceReadFuture<'_> {
        crate::DeviceReadFuture::from_or_box(async move {
            let _slot = self
                .queue_slots
                .acquire()
                .await
                .expect("the queue semaphore is never closed");
            crate::check_request(&self.name, self.size_bytes(), offset, length as u64)?;
            let completion = self.schedule(offset, length as u64);
            // The inner device works while the modelled time runs, so the request takes
            // the longer of the two.
            let result = self.inner.read(offset, length).await;
            wait_until(completion).await;
            result
        })
    }

    async fn write(&self, offset: u64, data: Arc<AlignedBuffer>) -> Result<(), DeviceError> {
        let _slot = self
            .queue_slots
            .acquire()
            .await
            .expect("the queue semaphore is never closed");
        crate::check_request(&self.name, self.size_bytes(), offset, data.len() as u64)?;
        let completion = self.schedule(offset, data.len() as u64);
        let result = self.inner.write(offset, data).await;
        wait_until(completion).await;
        result
    }

    /// Writes are modelled as written through to the platter (no volatile write
    /// cache), so a flush has no modelled cost of its own beyond the inner flush.
    async fn flush(&self) -> Result<(), DeviceError> {
        self.inner.flush().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryDevice;

    const MIB: u64 = 1 << 20;
    const MIB_USIZE: usize = 1 << 20;

    fn disk(size_bytes: u64) -> RotatingDiskDevice {
        RotatingDiskDevice::new(
            Arc::new(MemoryDevice::new(size_bytes)),
            RotatingDiskModel::default(),
        )
    }

    #[test]
    fn defaults_describe_a_7200_rpm_disk_and_deserialize_from_nothing() {
        let model: RotatingDiskModel = serde_json::from_str("{}").unwrap();
        assert_eq!(model, RotatingDiskModel::default());
        let millis = model.revolution().as_secs_f64() * 1e3;
        assert!((millis - 8.333).abs() < 0.01, "revolution {millis} ms");
        let partial: RotatingDiskModel =
            serde_json::from_str(r#"{"rotation_rpm": 5400, "seek_full_stroke_ms": 20.0}"#).unwrap();
        assert_eq!(partial.rotation_rpm, 5400);
        assert_eq!(partial.seek_full_stroke_ms, 20.0);
        assert_eq!(partial.transfer_bytes_per_second, 180_000_000);
    }

    #[test]
    fn seek_time_grows_with_distance_between_the_two_bounds() {
        let model = RotatingDiskModel::default();
        let stroke = 1 << 40;
        assert_eq!(model.seek_time(0, stroke), Duration::ZERO);
        let shortest = model.seek_time(4096, stroke).as_secs_f64() * 1e3;
        assert!(
            (0.5..0.6).contains(&shortest),
            "track-to-track {shortest} ms"
        );
        let full = model.seek_time(stroke, stroke).as_secs_f64() * 1e3;
        assert!((full - 15.0).abs() < 1e-9, "full stroke {full} ms");
        let mut previous = Duration::ZERO;
        for step in 1..=64u64 {
            let seek = model.seek_time(stroke / 64 * step, stroke);
            assert!(seek > previous);
            previous = seek;
        }
        // Square-root shaped: a quarter of the stroke costs half the span.
        let quarter = model.seek_time(stroke / 4, stroke).as_secs_f64() * 1e3;
        assert!((quarter - 7.75).abs() < 1e-6, "quarter stroke {quarter} ms");
    }

    #[tokio::test(start_paused = true)]
    async fn sequential_megabyte_reads_run_close_to_the_transfer_rate() {
        let device = disk(256 * MIB);
        let count = 128u64;
        let started = Instant::now();
        for index in 0..count {
            let buffer = device.read(index * MIB, MIB_USIZE).await.unwrap();
            assert_eq!(buffer.len(), MIB_USIZE);
        }
        let elapsed = started.elapsed().as_secs_f64();
        let rate = (count * MIB) as f64 / elapsed;
        let configured = device.model().transfer_bytes_per_second as f64;
        assert!(
            rate > 0.95 * configured && rate < configured * 1.01,
            "sequential rate {rate:.0} B/s against {configured} B/s"
        );
        let statistics = device.statistics();
        assert_eq!(statistics.requests, count);
        // The head starts at byte 0, so even the first read is sequential.
        assert_eq!(statistics.sequential_requests, count);
    }

    #[tokio::test(start_paused = true)]
    async fn sequential_small_reads_are_not_slowed_by_the_millisecond_timer() {
        let device = disk(64 * MIB);
        let count = 8192u64;
        let started = Instant::now();
        for index in 0..count {
            device.read(index * 4096, 4096).await.unwrap();
        }
        let rate = (count * 4096) as f64 / started.elapsed().as_secs_f64();
        let configured = device.model().transfer_bytes_per_second as f64;
        assert!(
            rate > 0.95 * configured && rate < configured * 1.05,
            "4 KiB sequential rate {rate:.0} B/s against {configured} B/s"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn random_small_reads_pay_seek_and_rotation() {
        let device = disk(256 * MIB);
        let blocks = 256 * MIB / 4096;
        let mut rng = SmallRng::seed_from_u64(7);
        let count = 400u32;
        let started = Instant::now();
        for _ in 0..count {
            let block = rng.random_range(0..blocks);
            device.read(block * 4096, 4096).await.unwrap();
        }
        let mean_ms = started.elapsed().as_secs_f64() * 1e3 / f64::from(count);
        // Expected: 8.2 ms average seek + 4.17 ms average rotation + 0.02 ms transfer.
        assert!((4.0..20.0).contains(&mean_ms), "mean {mean_ms:.2} ms");
        assert!((10.0..15.0).contains(&mean_ms), "mean {mean_ms:.2} ms");
        let statistics = device.statistics();
        let mean_rotation_ms =
            statistics.rotation_time.as_secs_f64() * 1e3 / statistics.requests as f64;
        assert!((3.0..5.5).contains(&mean_rotation_ms), "{mean_rotation_ms}");
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_requests_are_served_one_at_a_time() {
        let device = Arc::new(disk(256 * MIB));
        let count = 16u64;
        let started = Instant::now();
        let tasks: Vec<_> = (0..count)
            .map(|index| {
                let device = device.clone();
                tokio::spawn(async move {
                    device.read(index * MIB, MIB_USIZE).await.unwrap();
                    Instant::now()
                })
            })
            .collect();
        let mut completions = Vec::new();
        for task in tasks {
            completions.push(task.await.unwrap());
        }
        let elapsed = completions.iter().max().unwrap().duration_since(started);
        // Independent sleeps would all end within one worst-case service time
        // (15 + 8.33 + 5.8 ms); a single head needs at least the sum of transfers.
        let transfer = device.model().transfer_time(MIB);
        assert!(
            elapsed + TIMER_TICK >= transfer * u32::try_from(count).expect("a few requests"),
            "16 concurrent reads finished in {elapsed:?}"
        );
        completions.sort();
        completions.dedup();
        assert_eq!(
            completions.len(),
            crate::buffer_length(count),
            "completions must differ"
        );
        // The head never idled, so the last completion is the sum of service times
        // (to within one timer tick).
        let busy = device.statistics().busy_time;
        assert!(
            elapsed.abs_diff(busy) <= TIMER_TICK,
            "{elapsed:?} vs {busy:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn queue_depth_limit_does_not_change_the_total_time() {
        let model = RotatingDiskModel {
            queue_depth_max: 2,
            ..RotatingDiskModel::default()
        };
        let device = Arc::new(RotatingDiskDevice::new(
            Arc::new(MemoryDevice::new(64 * MIB)),
            model,
        ));
        let started = Instant::now();
        let tasks: Vec<_> = (0..8u64)
            .map(|index| {
                let device = device.clone();
                tokio::spawn(async move { device.read(index * 7 * MIB, 4096).await.unwrap() })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!(device.statistics().requests, 8);
        let elapsed = started.elapsed();
        let busy = device.statistics().busy_time;
        assert!(
            elapsed.abs_diff(busy) <= TIMER_TICK,
            "{elapsed:?} vs {busy:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn data_round_trips_unchanged_and_range_errors_pass_through() {
        let device = disk(16 * MIB);
        let mut rng = SmallRng::seed_from_u64(3);
        let mut written = Vec::new();
        for index in 0..32u64 {
            let mut buffer = AlignedBuffer::zeroed(8192);
            rng.fill(&mut buffer[..]);
            let offset = (index * 37 % 2048) * 8192 % (16 * MIB);
            device
                .write(offset, Arc::new(buffer.clone()))
                .await
                .unwrap();
            written.retain(|(previous, _): &(u64, AlignedBuffer)| *previous != offset);
            written.push((offset, buffer));
        }
        device.flush().await.unwrap();
        for (offset, expected) in &written {
            let read = device.read(*offset, expected.len()).await.unwrap();
            assert_eq!(&read[..], &expected[..]);
        }
        assert!(device.read(16 * MIB, 4096).await.is_err());
    }
}
