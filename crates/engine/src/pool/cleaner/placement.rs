//! Where relocated blocks go: hot/cold separation by how many cleanings data
//! has survived. Client writes fill the client stream; a block the cleaner moves
//! out of a segment of stream `k` goes to stream `k + 1` (the coldest stream
//! keeps what it moves), so that data which keeps surviving cleanings gathers in
//! segments that stay full and are seldom chosen again, apart from data that
//! survived once by chance and dies soon after. The stream of each segment is
//! kept in memory only: it steers placement, never correctness, so after a
//! restart every segment counts as a client segment until it is rewritten.
//!
//! Client writes are split too, by the lifespan of the block they replace, as
//! SepBIT does (Wang et al., "Separating Data via Block Invalidation Time
//! Inference for Write Amplification Reduction in Log-Structured Storage",
//! FAST 2022): a block whose previous version lived shorter than the client
//! segments the cleaner recently took is likely to die young again and goes to
//! the `Client` stream; first writes, and rewrites of blocks that lived longer
//! or survived a cleaning, go to `ClientCold`. Time is counted in client blocks
//! written, and a block's age is that of its segment (opened then, filled soon
//! after), so no per-block state is kept.
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

use crate::pool::state::{RELOCATION_STREAMS, STREAM_COUNT, Stream};

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

/// Each relocation stream takes data up to this many times older than the one
/// before it (the first takes data younger than ℓ). Simulated on Zipf(0.99)
/// at 85% live with 2,000 segments (examples/cleaner_policy_sim.rs): 1.14
/// blocks relocated per client block, against 1.15 with 4 and 1.25 with two
/// streams by cleanings survived.
pub const RELOCATION_AGE_FACTOR: u64 = 8;

/// Per-segment stream tags and the stream the cleaner currently relocates into.
#[derive(Clone, Debug)]
pub struct Placement {
    /// The stream whose head wrote each segment last; missing entries are
    /// client segments.
    segment_streams: Vec<Stream>,
    /// Client blocks written before each segment was opened.
    segment_opened_at_blocks: Vec<u64>,
    /// When clients wrote the data of each segment, in client blocks written:
    /// its opening for a client segment, the mean over its blocks of their
    /// victims' for a relocation segment.
    segment_data_written_at_blocks: Vec<u64>,
    /// Blocks relocated into each segment, which weigh that mean.
    segment_relocated_block_counts: Vec<u32>,
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
    pub counts: VictimCounts,
}

impl Default for Placement {
    fn default() -> Self {
        Self::new(false)
    }
}

impl Placement {
    /// Placement that splits relocations by the age of their data when
    /// `relocations_by_age`, or by cleanings survived.
    pub fn new(relocations_by_age: bool) -> Self {
        Self {
            segment_streams: Vec::new(),
            segment_opened_at_blocks: Vec::new(),
            segment_data_written_at_blocks: Vec::new(),
            segment_relocated_block_counts: Vec::new(),
            victim_data_written_at_blocks: 0,
            relocations_by_age,
            lifespan_samples_blocks: std::collections::VecDeque::new(),
            relocation_stream: Stream::Cleaner,
            counts: VictimCounts::default(),
        }
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
        self.segment_opened_at_blocks[index] = now_blocks;
        self.segment_data_written_at_blocks[index] = now_blocks;
        self.segment_relocated_block_counts[index] = 0;
    }

    fn grow_to(&mut self, index: usize) {
        if self.segment_streams.len() <= index {
            self.segment_streams.resize(index + 1, Stream::Client);
            self.segment_opened_at_blocks.resize(index + 1, 0);
            self.segment_data_written_at_blocks.resize(index + 1, 0);
            self.segment_relocated_block_counts.resize(index + 1, 0);
        }
    }

    /// Records that a block of the current victim was relocated into
    /// `segment_index`, whose data age becomes the mean of its blocks'.
    pub fn relocated_into(&mut self, segment_index: u32) {
        let index = segment_index as usize;
        self.grow_to(index);
        let count = u128::from(self.segment_relocated_block_counts[index]);
        let mean = u128::from(self.segment_data_written_at_blocks[index]);
        let victim = u128::from(self.victim_data_written_at_blocks);
        self.segment_data_written_at_blocks[index] = ((mean * count + victim) / (count + 1)) as u64;
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
        let mut bound = self.lifespan_threshold_blocks();
        for stream in &RELOCATION_STREAMS[..RELOCATION_STREAMS.len() - 1] {
            if age_blocks < bound {
                return *stream;
            }
            bound = bound.saturating_mul(RELOCATION_AGE_FACTOR);
        }
        RELOCATION_STREAMS[RELOCATION_STREAMS.len() - 1]
    }

    fn opened_at_blocks(&self, segment_index: u32) -> u64 {
        self.segment_opened_at_blocks
            .get(segment_index as usize)
            .copied()
            .unwrap_or(0)
    }

    /// The lifespan under which a replaced block counts as short-lived: the
    /// mean of the latest client victims' lifespans, or unbounded before the
    /// cleaner has taken any.
    pub fn lifespan_threshold_blocks(&self) -> u64 {
        if self.lifespan_samples_blocks.is_empty() {
            return u64::MAX;
        }
        self.lifespan_samples_blocks.iter().sum::<u64>() / self.lifespan_samples_blocks.len() as u64
    }

    /// The stream for a client write that replaces a block of
    /// `replaced_segment_index` (none: the block was unmapped), when clients
    /// have written `now_blocks` blocks.
    pub fn client_stream(&self, replaced_segment_index: Option<u32>, now_blocks: u64) -> Stream {
        let Some(segment_index) = replaced_segment_index else {
            return Stream::ClientCold;
        };
        match self.stream_of(segment_index) {
            Stream::Client | Stream::ClientCold => {
                let lifespan = now_blocks.saturating_sub(self.opened_at_blocks(segment_index));
                if lifespan < self.lifespan_threshold_blocks() {
                    Stream::Client
                } else {
                    Stream::ClientCold
                }
            }
            Stream::Cleaner
            | Stream::Cold
            | Stream::Colder
            | Stream::Coldest
            | Stream::Capacity => Stream::ClientCold,
        }
    }

    /// Chooses the stream for the live blocks of `victim_segment_index`, which
    /// the cleaner is about to move; it holds `live_blocks` now, and clients
    /// have written `now_blocks` blocks.
    pub fn start_victim(&mut self, victim_segment_index: u32, live_blocks: u32, now_blocks: u64) {
        let victim_stream = self.stream_of(victim_segment_index);
        if victim_stream == Stream::Client {
            let lifespan = now_blocks.saturating_sub(self.opened_at_blocks(victim_segment_index));
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
        assert_eq!(placement.counts.victims, [1, 1, 1, 0, 1, 0, 0]);
        assert_eq!(placement.counts.live_blocks, [10, 20, 30, 0, 40, 0, 0]);
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
    fn client_writes_split_by_the_lifespan_of_the_block_they_replace() {
        let mut placement = Placement::default();
        // Before any client victim, every rewrite of a client block is hot;
        // first writes and rewrites of relocated blocks are cold.
        placement.segment_opened(1, Stream::Client, 0);
        placement.segment_opened(2, Stream::Cleaner, 0);
        assert_eq!(placement.client_stream(Some(1), 1_000_000), Stream::Client);
        assert_eq!(placement.client_stream(None, 10), Stream::ClientCold);
        assert_eq!(placement.client_stream(Some(2), 10), Stream::ClientCold);
        // Client victims taken at ages 100 and 300 set the threshold to 200.
        placement.segment_opened(3, Stream::Client, 1_000);
        placement.start_victim(3, 5, 1_100);
        placement.segment_opened(4, Stream::Client, 1_000);
        placement.start_victim(4, 5, 1_300);
        assert_eq!(placement.lifespan_threshold_blocks(), 200);
        placement.segment_opened(5, Stream::ClientCold, 2_000);
        assert_eq!(placement.client_stream(Some(5), 2_150), Stream::Client);
        assert_eq!(placement.client_stream(Some(5), 2_250), Stream::ClientCold);
        // Only the latest samples count.
        for index in 0..LIFESPAN_SAMPLE_COUNT_MAX as u32 {
            placement.segment_opened(10 + index, Stream::Client, 5_000);
            placement.start_victim(10 + index, 1, 5_050);
        }
        assert_eq!(placement.lifespan_threshold_blocks(), 50);
    }
}
