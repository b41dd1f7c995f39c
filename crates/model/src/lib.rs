//! Models of the lamina engine, without I/O: what the engine's decisions
//! would do on synthetic workloads, fast enough to compare policies and to
//! see what any policy could reach. Where a model stands for the engine it
//! calls the engine's own decision functions ([`lamina_engine::model_api`]:
//! victim scoring, placement of client writes and relocations) or types
//! (`tier::heat::Heat`), never copies of them, so that a change to the engine
//! is what the models measure.
//!
//! - [`cache`]: flash cache admission and eviction policies (LRU, S3-FIFO,
//!   W-TinyLFU and the engine's log FIFO driven by its heat) and a hit-ratio
//!   simulation (docs/decisions/0004-cache-admission-policy.md).
//! - [`cleaner`]: the log, cleaner and placement (docs/decisions/0010 and
//!   0011).
//! - [`zipf`]: Zipf's law and the traces drawn from it.
//! - [`bounds`]: greedy cleaning's write amplification under uniform
//!   overwrites and the floor any placement could reach under Zipf ones.
//!
//! The examples of this crate (`cache_policy`, `cleaner_policy_sim`,
//! `zipf_cleaning_bound`) print the tables of BENCHMARKS.md.

pub mod bounds;
pub mod cache;
pub mod cleaner;
mod convert;
pub mod zipf;
