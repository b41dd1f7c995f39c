//! Pieces the engine's examples share: command-line lookup, a Zipf sampler and
//! greedy cleaning's victim live fraction.
//! Included with `#[path = "common/mod.rs"] mod common;` (an example
//! directory without `main.rs` is not an example of its own).

#![allow(dead_code)]

use rand::Rng;
use rand::rngs::SmallRng;

/// The value after `name` on the command line, or `default`.
pub fn argument(name: &str, default: &str) -> String {
    let arguments: Vec<String> = std::env::args().collect();
    arguments
        .iter()
        .position(|argument| argument == name)
        .and_then(|index| arguments.get(index + 1).cloned())
        .unwrap_or_else(|| default.to_string())
}

/// Draws ranks 0..n with probability proportional to 1 / (rank + 1)^theta, by
/// inverting a precomputed cumulative table.
pub struct Zipf {
    cumulative: Vec<f64>,
}

impl Zipf {
    pub fn new(count: usize, theta: f64) -> Self {
        let mut cumulative = Vec::with_capacity(count);
        let mut total = 0.0;
        for rank in 0..count {
            total += 1.0 / ((rank + 1) as f64).powf(theta);
            cumulative.push(total);
        }
        for value in &mut cumulative {
            *value /= total;
        }
        Self { cumulative }
    }

    pub fn sample(&self, rng: &mut SmallRng) -> usize {
        let draw: f64 = rng.random();
        self.cumulative
            .partition_point(|value| *value < draw)
            .min(self.cumulative.len() - 1)
    }

    /// The probability that a draw is `rank`.
    pub fn probability(&self, rank: usize) -> f64 {
        let below = if rank == 0 {
            0.0
        } else {
            self.cumulative[rank - 1]
        };
        self.cumulative[rank] - below
    }
}

/// The live fraction of greedy cleaning's victims under uniform overwrites at
/// live fraction `live`, in the large-segment limit: `x` solving
/// `(x - 1) / ln x = live` (equivalently `x = e^(-(1 - x) / live)`).
pub fn greedy_victim_live_fraction(live: f64) -> f64 {
    let mut low = 1e-12f64;
    let mut high = 1.0f64 - 1e-12;
    for _ in 0..100 {
        let middle = (low + high) / 2.0;
        if (middle - 1.0) / middle.ln() > live {
            high = middle;
        } else {
            low = middle;
        }
    }
    (low + high) / 2.0
}
