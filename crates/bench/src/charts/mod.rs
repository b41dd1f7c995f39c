//! Each benchmark's plot: how its report draws itself, as an implementation of
//! [`crate::plot::Chart`]. The benchmarks name only that trait and
//! [`crate::plot::render`], never these modules, so the reports do not depend on
//! their drawings and the shared primitives depend on neither.

mod curves;
mod rebuild;
mod snapshots;
mod tiers;
