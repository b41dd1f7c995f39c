//! Where relocated blocks go: hot/cold separation by how many cleanings data
//! has survived. Client writes fill the client stream; a block the cleaner moves
//! out of a segment of stream `k` goes to stream `k + 1` (the coldest stream
//! keeps what it moves), so that data which keeps surviving cleanings gathers in
//! segments that stay full and are seldom chosen again, apart from data that
//! survived once by chance and dies soon after. The stream of each segment,
//! its data's date and when it was last written (the victim age cost-benefit
//! weighs) are hints: they steer placement, never correctness. Checkpoints
//! keep them ([`Placement::image`]), so placement goes on across restarts;
//! time is counted in client blocks written over the pool's life.
//!
//! Client writes are split too, by how often the block is rewritten, in the
//! spirit of SepBIT (Wang et al., "Separating Data via Block Invalidation Time
//! Inference for Write Amplification Reduction in Log-Structured Storage",
//! FAST 2022). Each block carries a smoothed estimate of the interval between
//! its client writes: a level on a log scale ([`interval_level`]), one byte
//! in the block's map entry (`volume::map`, decision 0035), which relocation
//! keeps since it moves the entry's address only. A rewrite
//! samples the interval as the age of the replaced block's data and averages
//! it with the replaced block's estimate (a geometric mean), and goes to
//! `Client` under ℓ, `ClientWarm` under 8ℓ, else `ClientCold`, ℓ being the
//! mean lifespan of the client segments the cleaner recently took. First
//! writes go to `ClientCold`. Time is counted in client blocks written. One
//! sample per block, which the split used before, put far more long-lived
//! blocks among short-lived ones (simulated, crates/model/examples/cleaner_policy_sim.rs;
//! docs/decisions/0011-client-writes-by-rewrite-interval.md).
//!
//! In a one-tier pool relocations are split by age as well, again as SepBIT
//! does for the blocks its collector rewrites: a victim's live blocks go to
//! one of four relocation streams ([`RELOCATION_STREAMS`]) by how long ago
//! clients wrote the data, under ℓ, 8ℓ, 64ℓ or more (ℓ being the lifespan
//! threshold above). That age is kept per segment, not per block: a client
//! segment's data dates from its opening, and a relocation segment's is the
//! mean of the victims' its blocks came from. Without the split (two-tier
//! pools, whose flash is a FIFO), a relocated block goes one stream colder
//! per cleaning it survives instead.

use crate::convert::saturating_u64;
use crate::log::checkpoint::PlacementImage;
use crate::pool::io::stream::{CLIENT_STREAMS, RELOCATION_STREAMS, STREAM_COUNT, Stream};

/// What the cleaner has done per stream of victim, for measurements and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VictimCounts {
    /// Victims cleaned, indexed by the stream that wrote them.
    pub victims: [u64; STREAM_COUNT],
    /// Live blocks those victims held when chosen.
    pub live_blocks: [u64; STREAM_COUNT],
}

/// Recent client-segment lifespans averaged into the threshold that splits
/// client writes (SepBIT averages 16).
pub const LIFESPAN_SAMPLE_COUNT_MAX: usize = 16;

/// Each client or relocation stream takes intervals or ages up to this many
/// times longer than the one before it (the first takes those under ℓ).
/// Simulated on Zipf(0.99) at 85% live with 2,000 segments
/// (crates/model/examples/cleaner_policy_sim.rs): 1.14 blocks relocated per client block
/// with relocations by age, against 1.15 with a factor of 4 and 1.25 with two
/// streams by cleanings survived.
pub const CLASS_BOUND_FACTOR: u64 = 8;

/// Interval levels per doubling: a level is `1 + 8 × log2(interval)`, so
/// estimates are kept to within 9%.
const INTERVAL_LEVELS_PER_DOUBLING: f64 = 8.0;

/// The level of an interval of `blocks` client blocks written (at least 1):
/// 1 for 1 block, 255 from about 2^31.75 blocks (13 TiB) on; 0 means unknown.
pub fn interval_level(blocks: u64) -> u8 {
    let level = 1.0 + (blocks.max(1) as f64).log2() * INTERVAL_LEVELS_PER_DOUBLING;
    u8::try_from(saturating_u64(level.round())).unwrap_or(u8::MAX)
}

/// The interval, in client blocks written, that `level` (not 0) stands for.
pub fn interval_of_level(level: u8) -> u64 {
    assert!(level > 0, "level 0 is an unknown interval");
    saturating_u64(
        (f64::from(level - 1) / INTERVAL_LEVELS_PER_DOUBLING)
            .exp2()
            .floor(),
    )
}

/// The interval level a rewritten block carries: the replaced data's age
/// (`replaced_data_age_blocks`) samples the interval between the block's
/// writes and is averaged with the level the replaced block carried
/// (`previous_level`, 0 if unknown).
pub fn rewrite_interval_level(previous_level: u8, replaced_data_age_blocks: u64) -> u8 {
    let sample = interval_level(replaced_data_age_blocks);
    if previous_level == 0 {
        sample
    } else {
        // The mean of two levels is the geometric mean of the intervals.
        u8::try_from((u16::from(previous_level) + u16::from(sample)).div_ceil(2))
            .expect("the mean of two u8 levels fits in a u8")
    }
}

/// The class, out of `class_count`, of an interval or age of `blocks`: class
/// `i` takes those under ℓ · `bound_factor`ⁱ (ℓ being
/// `lifespan_threshold_blocks`), the last one all longer ones. The engine's
/// factor is [`CLASS_BOUND_FACTOR`].
pub fn interval_class(
    blocks: u64,
    lifespan_threshold_blocks: u64,
    bound_factor: u64,
    class_count: usize,
) -> usize {
    assert!(class_count > 0, "at least one class");
    let mut bound = lifespan_threshold_blocks;
    for class in 0..class_count - 1 {
        if blocks < bound {
            return class;
        }
        bound = bound.saturating_mul(bound_factor);
    }
    class_count - 1
}

/// ℓ: the mean of the latest client victims' lifespans, or unbounded before
/// the cleaner has taken any.
pub fn lifespan_threshold_blocks(samples_blocks: &std::collections::VecDeque<u64>) -> u64 {
    if samples_blocks.is_empty() {
        return u64::MAX;
    }
    samples_blocks.iter().sum::<u64>() / samples_blocks.len() as u64
}

/// When clients wrote a relocation segment's data once one more block, from
/// a victim whose data dates from `victim_data_written_at_blocks`, joins the
/// `relocated_block_count` blocks whose mean date is
/// `data_written_at_blocks`.
pub fn relocated_data_written_at_blocks(
    data_written_at_blocks: u64,
    relocated_block_count: u32,
    victim_data_written_at_blocks: u64,
) -> u64 {
    let count = u128::from(relocated_block_count);
    let mean = u128::from(data_written_at_blocks);
    let victim = u128::from(victim_data_written_at_blocks);
    u64::try_from((mean * count + victim) / (count + 1))
        .expect("a weighted mean of u64 values is at most their maximum")
}

/// The block a client write replaces, as the placement needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplacedBlock {
    /// The segment holding the replaced data, whose date is the data's.
    pub segment_index: u32,
    /// The interval level the map entry carried (0: unknown).
    pub interval_level: u8,
}

/// Where a client write goes, and the interval level its new block carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientPlacement {
    pub stream: Stream,
    pub interval_level: u8,
}

/// Per-segment stream tags and the stream the cleaner currently relocates into.
#[derive(Clone, Debug)]
pub struct Placement {
    /// The stream whose head wrote each segment last; missing entries are
    /// client segments.
    segment_streams: Vec<Stream>,
    /// When clients wrote the data of each segment, in client blocks written:
    /// its opening for a client segment (so also where a client segment's
    /// lifespan starts), the mean over its blocks of their victims' for a
    /// relocation segment.
    segment_data_written_at_blocks: Vec<u64>,
    /// Blocks relocated into each segment, which weigh that mean.
    segment_relocated_block_counts: Vec<u32>,
    /// When each segment's last batch was written, in client blocks written:
    /// the age the cleaner's cost-benefit weighs. (Batch sequences would not
    /// do: recovery makes them jump, which made every segment written before
    /// a restart look equally ancient until it was cleaned.)
    segment_last_written_at_blocks: Vec<u64>,
    /// When clients wrote the data of the victim being cleaned.
    victim_data_written_at_blocks: u64,
    /// Whether relocations are split by the age of their data (one-tier
    /// pools with the client split) or by cleanings survived.
    relocations_by_age: bool,
    /// Lifespans, in client blocks written, of the latest `Client` victims:
    /// from opening to being chosen by the cleaner.
    lifespan_samples_blocks: std::collections::VecDeque<u64>,
    /// Where the victim being cleaned sends its live blocks.
    relocation_stream: Stream,
    counts: VictimCounts,
}

impl Default for Placement {
    fn default() -> Self {
        Self::new(false)
    }
}

impl Placement {
    /// Victims cleaned so far and their live blocks, per stream that wrote them.
    pub fn counts(&self) -> VictimCounts {
        self.counts
    }

    /// Placement that splits relocations by the age of their data when
    /// `relocations_by_age`, or by cleanings survived.
    pub fn new(relocations_by_age: bool) -> Self {
        Self {
            segment_streams: Vec::new(),
            segment_data_written_at_blocks: Vec::new(),
            segment_relocated_block_counts: Vec::new(),
            segment_last_written_at_blocks: Vec::new(),
            victim_data_written_at_blocks: 0,
            relocations_by_age,
            lifespan_samples_blocks: std::collections::VecDeque::new(),
            relocation_stream: Stream::Cleaner,
            counts: VictimCounts::default(),
        }
    }

    /// The hints a checkpoint keeps: segment streams and data dates, and the
    /// lifespan samples (not the interval levels in the map entries, which
    /// rebuild as blocks are rewritten).
    pub fn image(&self) -> PlacementImage {
        PlacementImage {
            segment_streams: self
                .segment_streams
                .iter()
                .map(|stream| *stream as u8)
                .collect(),
            segment_data_written_at_blocks: self.segment_data_written_at_blocks.clone(),
            segment_last_written_at_blocks: self.segment_last_written_at_blocks.clone(),
            lifespan_samples_blocks: self.lifespan_samples_blocks.iter().copied().collect(),
        }
    }

    /// Takes the hints of `image` for the first `segment_count` segments (an
    /// unknown stream number counts as a client segment).
    pub fn restore(&mut self, image: &PlacementImage, segment_count: usize) {
        let count = image
            .segment_streams
            .len()
            .min(image.segment_data_written_at_blocks.len())
            .min(image.segment_last_written_at_blocks.len())
            .min(segment_count);
        self.segment_streams = image.segment_streams[..count]
            .iter()
            .map(|number| Stream::from_number(*number).unwrap_or(Stream::Client))
            .collect();
        self.segment_data_written_at_blocks =
            image.segment_data_written_at_blocks[..count].to_vec();
        self.segment_relocated_block_counts = vec![0; count];
        self.segment_last_written_at_blocks =
            image.segment_last_written_at_blocks[..count].to_vec();
        let skip = image
            .lifespan_samples_blocks
            .len()
            .saturating_sub(LIFESPAN_SAMPLE_COUNT_MAX);
        self.lifespan_samples_blocks = image.lifespan_samples_blocks[skip..]
            .iter()
            .copied()
            .collect();
    }

    /// Forgets what was known of `segment_index`, which was written again
    /// after the checkpoint its hints came from: a client segment dated `now_blocks`.
    pub fn forget_segment(&mut self, segment_index: u32, now_blocks: u64) {
        let index = segment_index as usize;
        self.grow_to(index);
        self.segment_streams[index] = Stream::Client;
        self.segment_data_written_at_blocks[index] = now_blocks;
        self.segment_relocated_block_counts[index] = 0;
        self.segment_last_written_at_blocks[index] = now_blocks;
    }

    /// Records that a batch was written into `segment_index` when clients
    /// had written `now_blocks` blocks.
    pub fn segment_written(&mut self, segment_index: u32, now_blocks: u64) {
        let index = segment_index as usize;
        self.grow_to(index);
        self.segment_last_written_at_blocks[index] = now_blocks;
    }

    /// When the last batch was written into `segment_index` (0, the oldest,
    /// if unknown).
    pub fn last_written_at_blocks(&self, segment_index: u32) -> u64 {
        self.segment_last_written_at_blocks
            .get(segment_index as usize)
            .copied()
            .unwrap_or(0)
    }

    /// The stream that wrote `segment_index` (client if unknown).
    pub fn stream_of(&self, segment_index: u32) -> Stream {
        self.segment_streams
            .get(segment_index as usize)
            .copied()
            .unwrap_or(Stream::Client)
    }

    /// Records that a head of `stream` opened `segment_index` when clients had
    /// written `now_blocks` blocks.
    pub fn segment_opened(&mut self, segment_index: u32, stream: Stream, now_blocks: u64) {
        let index = segment_index as usize;
        self.grow_to(index);
        self.segment_streams[index] = stream;
        self.segment_data_written_at_blocks[index] = now_blocks;
        self.segment_relocated_block_counts[index] = 0;
    }

    fn grow_to(&mut self, index: usize) {
        if self.segment_streams.len() <= index {
            self.segment_streams.resize(index + 1, Stream::Client);
            self.segment_data_written_at_blocks.resize(index + 1, 0);
            self.segment_relocated_block_counts.resize(index + 1, 0);
            self.segment_last_written_at_blocks.resize(index + 1, 0);
        }
    }

    /// Records that a block of the current victim was relocated into
    /// `segment_index`, whose data age becomes the mean of its blocks'.
    pub fn relocated_into(&mut self, segment_index: u32) {
        // Only relocation segments take relocated blocks, so a client
        // segment's date stays its opening.
        assert!(
            self.stream_of(segment_index).is_relocation(),
            "segment {segment_index} takes relocations but is not a relocation segment"
        );
        let index = segment_index as usize;
        self.segment_data_written_at_blocks[index] = relocated_data_written_at_blocks(
            self.segment_data_written_at_blocks[index],
            self.segment_relocated_block_counts[index],
            self.victim_data_written_at_blocks,
        );
        self.segment_relocated_block_counts[index] += 1;
    }

    /// When clients wrote the data of `segment_index` (0, the oldest, if
    /// unknown).
    fn data_written_at_blocks(&self, segment_index: u32) -> u64 {
        self.segment_data_written_at_blocks
            .get(segment_index as usize)
            .copied()
            .unwrap_or(0)
    }

    /// The relocation stream for data clients wrote `age_blocks` ago.
    fn relocation_stream_for_age(&self, age_blocks: u64) -> Stream {
        RELOCATION_STREAMS[self.class_of(age_blocks, RELOCATION_STREAMS.len())]
    }

    /// The lifespan under which a replaced block counts as short-lived: the
    /// mean of the latest client victims' lifespans, or unbounded before the
    /// cleaner has taken any.
    pub fn lifespan_threshold_blocks(&self) -> u64 {
        lifespan_threshold_blocks(&self.lifespan_samples_blocks)
    }

    /// Where a client write goes that replaces `replaced` (none: the block
    /// was unmapped), when clients have written `now_blocks` blocks.
    pub fn client_placement(
        &self,
        replaced: Option<ReplacedBlock>,
        now_blocks: u64,
    ) -> ClientPlacement {
        let Some(replaced) = replaced else {
            return ClientPlacement {
                stream: Stream::ClientCold,
                interval_level: 0,
            };
        };
        // The replaced data's age samples the interval between this block's
        // writes: its segment's date is within a segment's filling of it.
        let level = rewrite_interval_level(
            replaced.interval_level,
            now_blocks.saturating_sub(self.data_written_at_blocks(replaced.segment_index)),
        );
        ClientPlacement {
            stream: CLIENT_STREAMS[self.class_of(interval_of_level(level), CLIENT_STREAMS.len())],
            interval_level: level,
        }
    }

    /// The class, out of `class_count`, of an interval or age: class `i`
    /// takes those under ℓ · factorⁱ, the last one all longer ones.
    fn class_of(&self, blocks: u64, class_count: usize) -> usize {
        interval_class(
            blocks,
            self.lifespan_threshold_blocks(),
            CLASS_BOUND_FACTOR,
            class_count,
        )
    }

    /// Chooses the stream for the live blocks of `victim_segment_index`, which
    /// the cleaner is about to move; it holds `live_blocks` now, and clients
    /// have written `now_blocks` blocks.
    pub fn start_victim(&mut self, victim_segment_index: u32, live_blocks: u32, now_blocks: u64) {
        let victim_stream = self.stream_of(victim_segment_index);
        if victim_stream == Stream::Client {
            let lifespan =
                now_blocks.saturating_sub(self.data_written_at_blocks(victim_segment_index));
            if self.lifespan_samples_blocks.len() == LIFESPAN_SAMPLE_COUNT_MAX {
                self.lifespan_samples_blocks.pop_front();
            }
            self.lifespan_samples_blocks.push_back(lifespan);
        }
        self.counts.victims[victim_stream as usize] += 1;
        self.counts.live_blocks[victim_stream as usize] += u64::from(live_blocks);
        self.victim_data_written_at_blocks = self.data_written_at_blocks(victim_segment_index);
        self.relocation_stream = if self.relocations_by_age && victim_stream != Stream::Capacity {
            let age = now_blocks.saturating_sub(self.victim_data_written_at_blocks);
            self.relocation_stream_for_age(age)
        } else {
            victim_stream.colder()
        };
    }

    /// The stream a relocation appended now belongs to.
    pub fn relocation_stream(&self) -> Stream {
        self.relocation_stream
    }
}

#[cfg(test)]
#[allow(clippy::cast_possible_truncation)] // test patterns: small indexes, wrapping bytes
mod tests {
    use super::*;

    #[test]
    fn relocations_go_one_stream_colder_and_stop_at_the_coldest() {
        let mut placement = Placement::default();
        placement.start_victim(7, 10, 0);
        assert_eq!(placement.relocation_stream(), Stream::Cleaner);
        placement.segment_opened(3, Stream::Cleaner, 0);
        placement.start_victim(3, 20, 0);
        assert_eq!(placement.relocation_stream(), Stream::Cold);
        placement.segment_opened(3, Stream::Cold, 0);
        placement.start_victim(3, 30, 0);
        assert_eq!(placement.relocation_stream(), Stream::Cold);
        placement.segment_opened(4, Stream::ClientCold, 0);
        placement.start_victim(4, 40, 0);
        assert_eq!(placement.relocation_stream(), Stream::Cleaner);
        assert_eq!(placement.counts.victims, [1, 1, 1, 0, 1, 0, 0, 0]);
        assert_eq!(placement.counts.live_blocks, [10, 20, 30, 0, 40, 0, 0, 0]);
    }

    #[test]
    fn relocations_split_by_the_age_of_their_data() {
        let mut placement = Placement::new(true);
        // One client victim, opened at 1,000 and taken at 1,100, sets ℓ to
        // 100; its data is 100 blocks old, not younger than ℓ.
        placement.segment_opened(1, Stream::Client, 1_000);
        placement.start_victim(1, 10, 1_100);
        assert_eq!(placement.lifespan_threshold_blocks(), 100);
        assert_eq!(placement.relocation_stream(), Stream::Cold);
        // Its blocks, relocated into segment 2, keep their data's age rather
        // than the relocation's: taken at 1,150 they are 150 old, as old
        // as a client segment opened at 1,000.
        placement.segment_opened(2, Stream::Cold, 1_100);
        placement.relocated_into(2);
        placement.relocated_into(2);
        placement.segment_opened(3, Stream::ClientCold, 1_090);
        placement.start_victim(3, 1, 1_150);
        assert_eq!(placement.relocation_stream(), Stream::Cleaner);
        placement.start_victim(2, 2, 1_150);
        assert_eq!(placement.relocation_stream(), Stream::Cold);
        // A segment that took blocks from victims of two ages dates from
        // their mean, weighted by blocks: (2 × 1,000 + 1 × 1,090) / 3 = 1,030.
        placement.segment_opened(4, Stream::Cold, 1_150);
        placement.start_victim(2, 2, 1_150);
        placement.relocated_into(4);
        placement.relocated_into(4);
        placement.start_victim(3, 1, 1_150);
        placement.relocated_into(4);
        // Ages under ℓ, 8ℓ, 64ℓ and beyond pick the four streams.
        for (now, stream) in [
            (1_030 + 99, Stream::Cleaner),
            (1_030 + 799, Stream::Cold),
            (1_030 + 6_399, Stream::Colder),
            (1_030 + 6_400, Stream::Coldest),
        ] {
            placement.start_victim(4, 3, now);
            assert_eq!(placement.relocation_stream(), stream, "at {now}");
        }
        // Without the split, relocations go one stream colder per cleaning.
        let mut chain = Placement::new(false);
        chain.segment_opened(1, Stream::Client, 0);
        chain.start_victim(1, 10, 1_000_000);
        assert_eq!(chain.relocation_stream(), Stream::Cleaner);
    }

    #[test]
    fn a_reused_segment_takes_the_stream_of_its_new_head() {
        let mut placement = Placement::default();
        placement.segment_opened(5, Stream::Cold, 0);
        placement.segment_opened(5, Stream::Client, 0);
        assert_eq!(placement.stream_of(5), Stream::Client);
        assert_eq!(placement.stream_of(6), Stream::Client);
    }

    #[test]
    fn client_writes_split_by_the_smoothed_interval_between_rewrites() {
        // The replaced block's segment, and the level its map entry carried.
        let replaced = |segment_index: u32, interval_level: u8| {
            Some(ReplacedBlock {
                segment_index,
                interval_level,
            })
        };
        let stream = |placement: &Placement, replaced: Option<ReplacedBlock>, now: u64| {
            placement.client_placement(replaced, now).stream
        };
        let mut placement = Placement::default();
        // Before any client victim, every rewrite is hot; first writes are
        // cold and carry no estimate.
        placement.segment_opened(1, Stream::Client, 0);
        assert_eq!(
            stream(&placement, replaced(1, 0), 1_000_000),
            Stream::Client
        );
        assert_eq!(
            placement.client_placement(None, 10),
            ClientPlacement {
                stream: Stream::ClientCold,
                interval_level: 0
            }
        );
        // Client victims taken at ages 100 and 300 set ℓ to 200.
        placement.segment_opened(3, Stream::Client, 1_000);
        placement.start_victim(3, 5, 1_100);
        placement.segment_opened(4, Stream::Client, 1_000);
        placement.start_victim(4, 5, 1_300);
        assert_eq!(placement.lifespan_threshold_blocks(), 200);
        // With no estimate yet, the sample alone decides: the replaced data's
        // age (segment 5 was opened at 2,000) against ℓ and 8ℓ.
        placement.segment_opened(5, Stream::ClientCold, 2_000);
        assert_eq!(stream(&placement, replaced(5, 0), 2_150), Stream::Client);
        assert_eq!(
            stream(&placement, replaced(5, 0), 2_250),
            Stream::ClientWarm
        );
        assert_eq!(
            stream(&placement, replaced(5, 0), 3_700),
            Stream::ClientCold
        );
        // A block rewritten about every 1,000 blocks (ClientWarm), once after
        // 100,000: the estimate is the geometric mean, 10,000, ClientCold;
        // after 40 it is 200, ClientWarm rather than Client.
        let every_thousand = interval_level(1_000);
        let slow = placement.client_placement(replaced(5, every_thousand), 102_000);
        assert_eq!(slow.stream, Stream::ClientCold);
        let estimate = interval_of_level(slow.interval_level);
        assert!((9_000..11_000).contains(&estimate), "{estimate}");
        assert_eq!(
            stream(&placement, replaced(5, every_thousand), 2_040),
            Stream::ClientWarm
        );
        // Only the latest victims count in ℓ.
        for index in 0..LIFESPAN_SAMPLE_COUNT_MAX as u32 {
            placement.segment_opened(10 + index, Stream::Client, 5_000);
            placement.start_victim(10 + index, 1, 5_050);
        }
        assert_eq!(placement.lifespan_threshold_blocks(), 50);
    }

    #[test]
    fn interval_levels_keep_intervals_to_within_a_tenth() {
        assert_eq!(interval_level(0), 1);
        assert_eq!(interval_level(1), 1);
        assert_eq!(interval_level(u64::MAX), 255);
        for blocks in [2u64, 3, 10, 1_000, 123_456, 1 << 30] {
            let back = interval_of_level(interval_level(blocks)) as f64;
            let error = (back - blocks as f64).abs() / blocks as f64;
            assert!(error < 0.1, "{blocks} came back as {back}");
        }
    }

    #[test]
    fn hints_survive_an_image_and_forgotten_segments_restart_as_client_segments() {
        let mut placement = Placement::new(true);
        placement.segment_opened(0, Stream::Client, 100);
        placement.segment_written(0, 150);
        placement.segment_opened(2, Stream::Coldest, 200);
        placement.victim_data_written_at_blocks = 40;
        placement.relocated_into(2);
        placement.segment_written(2, 260);
        placement.lifespan_samples_blocks.push_back(1_000);
        let image = placement.image();
        let mut restored = Placement::new(true);
        restored.restore(&image, 3);
        assert_eq!(restored.image(), image);
        assert_eq!(restored.stream_of(2), Stream::Coldest);
        assert_eq!(restored.data_written_at_blocks(2), 40);
        assert_eq!(restored.last_written_at_blocks(2), 260);
        assert_eq!(restored.lifespan_threshold_blocks(), 1_000);
        // Only the pool's segments are taken, and an unknown stream number
        // is a client segment.
        let mut odd = image.clone();
        odd.segment_streams[0] = 200;
        let mut small = Placement::new(true);
        small.restore(&odd, 2);
        assert_eq!(small.stream_of(0), Stream::Client);
        assert_eq!(small.image().segment_streams.len(), 2);
        restored.forget_segment(2, 900);
        assert_eq!(restored.stream_of(2), Stream::Client);
        assert_eq!(restored.data_written_at_blocks(2), 900);
        assert_eq!(restored.last_written_at_blocks(2), 900);
    }

    #[test]
    fn every_stream_number_names_its_stream() {
        for number in 0..STREAM_COUNT as u8 {
            let stream = Stream::from_number(number).expect("a stream for every head");
            assert_eq!(stream as u8, number);
        }
        assert_eq!(Stream::from_number(STREAM_COUNT as u8), None);
    }
}
