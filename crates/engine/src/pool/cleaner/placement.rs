//! Where relocated blocks go: hot/cold separation by how many cleanings data
//! has survived. Client writes fill the client stream; a block the cleaner moves
//! out of a segment of stream `k` goes to stream `k + 1` (the coldest stream
//! keeps what it moves), so that data which keeps surviving cleanings gathers in
//! segments that stay full and are seldom chosen again, apart from data that
//! survived once by chance and dies soon after. The stream of each segment is
//! kept in memory only: it steers placement, never correctness, so after a
//! restart every segment counts as a client segment until it is rewritten.

use crate::pool::state::{STREAM_COUNT, Stream};

/// What the cleaner has done per stream of victim, for measurements and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VictimCounts {
    /// Victims cleaned, indexed by the stream that wrote them.
    pub victims: [u64; STREAM_COUNT],
    /// Live blocks those victims held when chosen.
    pub live_blocks: [u64; STREAM_COUNT],
}

/// Per-segment stream tags and the stream the cleaner currently relocates into.
#[derive(Clone, Debug)]
pub struct Placement {
    /// The stream whose head wrote each segment last; missing entries are
    /// client segments.
    segment_streams: Vec<Stream>,
    /// Where the victim being cleaned sends its live blocks.
    relocation_stream: Stream,
    pub counts: VictimCounts,
}

impl Default for Placement {
    fn default() -> Self {
        Self {
            segment_streams: Vec::new(),
            relocation_stream: Stream::Cleaner,
            counts: VictimCounts::default(),
        }
    }
}

impl Placement {
    /// The stream that wrote `segment_index` (client if unknown).
    pub fn stream_of(&self, segment_index: u32) -> Stream {
        self.segment_streams
            .get(segment_index as usize)
            .copied()
            .unwrap_or(Stream::Client)
    }

    /// Records that a head of `stream` opened `segment_index`.
    pub fn segment_opened(&mut self, segment_index: u32, stream: Stream) {
        let index = segment_index as usize;
        if self.segment_streams.len() <= index {
            self.segment_streams.resize(index + 1, Stream::Client);
        }
        self.segment_streams[index] = stream;
    }

    /// Chooses the stream for the live blocks of `victim_segment_index`, which
    /// the cleaner is about to move; it holds `live_blocks` now.
    pub fn start_victim(&mut self, victim_segment_index: u32, live_blocks: u32) {
        let victim_stream = self.stream_of(victim_segment_index);
        self.counts.victims[victim_stream as usize] += 1;
        self.counts.live_blocks[victim_stream as usize] += u64::from(live_blocks);
        self.relocation_stream = victim_stream.colder();
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
        placement.start_victim(7, 10);
        assert_eq!(placement.relocation_stream(), Stream::Cleaner);
        placement.segment_opened(3, Stream::Cleaner);
        placement.start_victim(3, 20);
        assert_eq!(placement.relocation_stream(), Stream::Cold);
        placement.segment_opened(3, Stream::Cold);
        placement.start_victim(3, 30);
        assert_eq!(placement.relocation_stream(), Stream::Cold);
        assert_eq!(placement.counts.victims, [1, 1, 1, 0]);
        assert_eq!(placement.counts.live_blocks, [10, 20, 30, 0]);
    }

    #[test]
    fn a_reused_segment_takes_the_stream_of_its_new_head() {
        let mut placement = Placement::default();
        placement.segment_opened(5, Stream::Cold);
        placement.segment_opened(5, Stream::Client);
        assert_eq!(placement.stream_of(5), Stream::Client);
        assert_eq!(placement.stream_of(6), Stream::Client);
    }
}
