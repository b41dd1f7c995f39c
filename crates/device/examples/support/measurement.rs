//! What every benchmark example measures with, in the device's examples and
//! (included by path, as an example cannot use another crate's example
//! modules) the engine's: the runtime a measurement runs on, the median of
//! its runs and how its report is printed.

/// A tokio runtime: on this thread when `worker_threads` is 0, else with that many
/// workers.
pub fn runtime(worker_threads: usize) -> anyhow::Result<tokio::runtime::Runtime> {
    let runtime = if worker_threads == 0 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(worker_threads)
            .enable_all()
            .build()?
    };
    Ok(runtime)
}

/// The median (mean of the middle two for an even count); NaN when empty.
pub fn median(values: &[f64]) -> f64 {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| !v.is_nan()).collect();
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted.sort_by(f64::total_cmp);
    let middle = sorted.len() / 2;
    if sorted.len() % 2 == 1 {
        sorted[middle]
    } else {
        f64::midpoint(sorted[middle - 1], sorted[middle])
    }
}

/// Prints a report: one JSON document with `json`, else its table.
pub fn print_report(report: &impl serde::Serialize, table: &str, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(report)?);
    } else {
        print!("{table}");
    }
    Ok(())
}
