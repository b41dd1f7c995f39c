//! The log's streams and lanes: which head a block is appended to (client
//! writes split by how often they are rewritten, relocations by the age of
//! their data, demotions to capacity), and which open batch (lane) a stream's
//! appends go to. Shared by the log writer and the cleaner's placement, so it
//! depends on neither.

/// The log heads. Client writes and cleaner relocations go to different
/// segments, so that data the cleaner found cold is not mixed with fresh, hot
/// writes and stops being recleaned; relocations are further split by the age
/// of their data or the cleanings it survived (see `cleaner::placement`), and
/// client writes by how often the block is rewritten (`Client`, `ClientWarm`
/// and `ClientCold`). One batch of any other stream is open at a time (the
/// main batch, lane 0), plus one of `ClientCold` (lane 1) and one of
/// `ClientWarm` (lane 2; see [`lane_of`]). Sequences are given when batches
/// are sealed, and replay goes in sequence order, so before a record is
/// appended to one of them, the others are sealed if they hold a record that
/// does not commute with it (see `OpenBatch::conflicts_with`): replay then
/// meets conflicting records in the order they were appended in memory
/// (docs/decisions/0008).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    /// Client writes of blocks rewritten more often than recently cleaned
    /// client segments lived, records without data, and promotions.
    Client = 0,
    /// Relocations. Appending to it means "the cleaner's stream for the current
    /// victim": `make_room` resolves it to this stream (data that survived one
    /// cleaning) or a colder one through `State::placement`.
    Cleaner = 1,
    /// Data that survived two or more cleanings.
    Cold = 2,
    /// The capacity tier of a two-tier pool: blocks the cleaner demotes from
    /// flash, and blocks it moves out of capacity victims.
    Capacity = 3,
    /// Client writes predicted long-lived: first writes of a block, and
    /// rewrites of blocks rewritten seldom.
    ClientCold = 4,
    /// Relocations of data older still than `Cold`'s (see
    /// `cleaner::placement`; one-tier pools only).
    Colder = 5,
    /// Relocations of the oldest data.
    Coldest = 6,
    /// Client writes of blocks rewritten less often than `Client`'s and more
    /// often than `ClientCold`'s.
    ClientWarm = 7,
}

/// Number of log heads (one per [`Stream`]).
pub const STREAM_COUNT: usize = 8;

/// Every stream, by number.
pub const ALL_STREAMS: [Stream; STREAM_COUNT] = [
    Stream::Client,
    Stream::Cleaner,
    Stream::Cold,
    Stream::Capacity,
    Stream::ClientCold,
    Stream::Colder,
    Stream::Coldest,
    Stream::ClientWarm,
];

/// The client streams of a one-tier pool, most often rewritten first.
pub const CLIENT_STREAMS: [Stream; 3] = [Stream::Client, Stream::ClientWarm, Stream::ClientCold];

/// The relocation streams of a one-tier pool, youngest data first: the
/// cleaner sends a victim's live blocks to one of them by the age of the data
/// (`cleaner::placement`).
pub const RELOCATION_STREAMS: [Stream; 4] = [
    Stream::Cleaner,
    Stream::Cold,
    Stream::Colder,
    Stream::Coldest,
];

/// Batches open at once: the main one, the cold client one and the warm
/// client one.
pub const OPEN_BATCH_COUNT: usize = 3;

/// The open batch (lane) a stream's appends go to: 1 for `ClientCold`, 2 for
/// `ClientWarm`, 0 (the main batch) for every other stream.
pub fn lane_of(stream: Stream) -> usize {
    match stream {
        Stream::ClientCold => 1,
        Stream::ClientWarm => 2,
        _ => 0,
    }
}

impl Stream {
    /// The stream for data that survives one more cleaning, when streams are
    /// not chosen by the age of the data (a two-tier pool's flash, or the
    /// client split turned off).
    pub fn colder(self) -> Stream {
        match self {
            Stream::Client | Stream::ClientWarm | Stream::ClientCold => Stream::Cleaner,
            Stream::Cleaner | Stream::Cold => Stream::Cold,
            Stream::Colder | Stream::Coldest => Stream::Coldest,
            Stream::Capacity => Stream::Capacity,
        }
    }

    /// Whether this is one of the flash relocation streams.
    pub fn is_relocation(self) -> bool {
        RELOCATION_STREAMS.contains(&self)
    }

    /// The stream numbered `number` (its discriminant), if any.
    pub fn from_number(number: u8) -> Option<Stream> {
        [
            Stream::Client,
            Stream::Cleaner,
            Stream::Cold,
            Stream::Capacity,
            Stream::ClientCold,
            Stream::Colder,
            Stream::Coldest,
            Stream::ClientWarm,
        ]
        .into_iter()
        .find(|stream| *stream as u8 == number)
    }
}
