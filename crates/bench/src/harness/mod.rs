//! What every benchmark scenario shares, so that a scenario holds only what it
//! measures: the options every scenario repeats ([`arguments`]), the statistics of
//! samples ([`statistics`]) and the text tables ([`table`]). Child processes and
//! their CPU time are in [`crate::process`] and [`crate::cpu`].

pub mod arguments;
pub mod statistics;
pub mod table;
