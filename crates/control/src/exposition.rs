//! The Prometheus text exposition format (version 0.0.4) that `/metrics`
//! answers with, written through typed families: a [`Exposition::counter`]
//! (a value that only grows; its name ends in `_total`), a
//! [`Exposition::gauge`] (a value that goes up and down) and a
//! [`Exposition::histogram`] (cumulative buckets, sum and count). Each family
//! writes its `# HELP` and `# TYPE` lines once, before its samples, and
//! escapes help texts and label values; the naming rules are asserted, since
//! a name that breaks them is a programmer error. Why a writer of our own and
//! not `prometheus-client`: docs/decisions/0061-typed-metrics.md.

use std::collections::BTreeSet;
use std::fmt::Write;

/// One sample's value: the daemon's counts are integers, its ratios and
/// times are reals.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SampleValue {
    Integer(u64),
    Real(f64),
}

impl From<u64> for SampleValue {
    fn from(value: u64) -> Self {
        SampleValue::Integer(value)
    }
}

impl From<u32> for SampleValue {
    fn from(value: u32) -> Self {
        SampleValue::Integer(u64::from(value))
    }
}

impl From<usize> for SampleValue {
    fn from(value: usize) -> Self {
        SampleValue::Integer(u64::try_from(value).unwrap_or(u64::MAX))
    }
}

/// A flag: 1 when set, 0 when not.
impl From<bool> for SampleValue {
    fn from(value: bool) -> Self {
        SampleValue::Integer(u64::from(value))
    }
}

impl From<f64> for SampleValue {
    fn from(value: f64) -> Self {
        SampleValue::Real(value)
    }
}

/// One label: its name and (unescaped) value.
#[derive(Clone, Copy, Debug)]
pub struct Label<'a> {
    pub name: &'static str,
    pub value: &'a str,
}

/// A shorthand for a [`Label`].
pub fn label<'a>(name: &'static str, value: &'a str) -> Label<'a> {
    Label { name, value }
}

/// The text of one `/metrics` answer, written family by family.
#[derive(Debug, Default)]
pub struct Exposition {
    text: String,
    /// Family names written so far: a name may appear once.
    families: BTreeSet<String>,
}

impl Exposition {
    pub fn new() -> Self {
        Self::default()
    }

    /// A value that only grows (until the daemon or the pool restarts).
    pub fn counter(&mut self, name: &str, help: &str) -> Family<'_> {
        assert!(
            name.ends_with("_total"),
            "the counter {name} must end in _total"
        );
        self.family(name, help, "counter")
    }

    /// A value that goes up and down.
    pub fn gauge(&mut self, name: &str, help: &str) -> Family<'_> {
        assert!(
            !name.ends_with("_total"),
            "the gauge {name} must not end in _total (that suffix is for counters)"
        );
        self.family(name, help, "gauge")
    }

    /// A distribution: cumulative buckets by upper bound, a sum and a count.
    pub fn histogram(&mut self, name: &str, help: &str) -> Histogram<'_> {
        assert!(
            !name.ends_with("_total") && !name.ends_with("_bucket"),
            "the histogram {name} must not end in _total or _bucket"
        );
        let family = self.family(name, help, "histogram");
        Histogram { family }
    }

    /// The whole answer.
    pub fn into_text(self) -> String {
        self.text
    }

    fn family(&mut self, name: &str, help: &str, kind: &str) -> Family<'_> {
        assert!(valid_name(name), "{name} is not a valid metric name");
        assert!(
            self.families.insert(name.to_string()),
            "the metric family {name} is written twice"
        );
        let _ = writeln!(self.text, "# HELP {name} {}", escape_help(help));
        let _ = writeln!(self.text, "# TYPE {name} {kind}");
        Family {
            text: &mut self.text,
            name: name.to_string(),
        }
    }
}

/// A counter or gauge family whose header is written: its samples follow.
#[derive(Debug)]
pub struct Family<'a> {
    text: &'a mut String,
    name: String,
}

impl Family<'_> {
    /// One series of the family.
    pub fn sample(&mut self, labels: &[Label<'_>], value: impl Into<SampleValue>) -> &mut Self {
        write_sample(self.text, &self.name, labels, value.into());
        self
    }
}

/// A histogram family whose header is written: its series follow.
#[derive(Debug)]
pub struct Histogram<'a> {
    family: Family<'a>,
}

/// One histogram series: cumulative counts by upper bound (ascending, the
/// `+Inf` bucket left out: it is `count`), the sum of the observed values and
/// their count.
#[derive(Clone, Debug, PartialEq)]
pub struct HistogramSeries {
    pub buckets: Vec<Bucket>,
    pub sum: f64,
    pub count: u64,
}

/// Observations at or below `upper_bound`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bucket {
    pub upper_bound: f64,
    pub cumulative_count: u64,
}

impl Histogram<'_> {
    /// One series: its `_bucket` lines (with `le`), `_sum` and `_count`.
    pub fn series(&mut self, labels: &[Label<'_>], series: &HistogramSeries) -> &mut Self {
        assert!(
            series
                .buckets
                .windows(2)
                .all(|pair| pair[0].upper_bound < pair[1].upper_bound
                    && pair[0].cumulative_count <= pair[1].cumulative_count),
            "histogram buckets ascend and are cumulative"
        );
        assert!(
            series
                .buckets
                .last()
                .is_none_or(|last| last.cumulative_count <= series.count),
            "no bucket holds more than the count"
        );
        let family = &mut self.family;
        let bucket_name = format!("{}_bucket", family.name);
        for bucket in &series.buckets {
            let bound = format_value(SampleValue::Real(bucket.upper_bound));
            let with_bound = with_label(labels, label("le", &bound));
            let value = SampleValue::Integer(bucket.cumulative_count);
            write_sample(family.text, &bucket_name, &with_bound, value);
        }
        let with_infinity = with_label(labels, label("le", "+Inf"));
        let count = SampleValue::Integer(series.count);
        write_sample(family.text, &bucket_name, &with_infinity, count);
        let sum_name = format!("{}_sum", family.name);
        write_sample(
            family.text,
            &sum_name,
            labels,
            SampleValue::Real(series.sum),
        );
        let count_name = format!("{}_count", family.name);
        write_sample(family.text, &count_name, labels, count);
        self
    }
}

fn with_label<'a>(labels: &[Label<'a>], last: Label<'a>) -> Vec<Label<'a>> {
    labels
        .iter()
        .copied()
        .chain(std::iter::once(last))
        .collect()
}

fn write_sample(text: &mut String, name: &str, labels: &[Label<'_>], value: SampleValue) {
    text.push_str(name);
    if !labels.is_empty() {
        text.push('{');
        for (position, label) in labels.iter().enumerate() {
            assert!(
                valid_label_name(label.name),
                "{} is not a valid label name",
                label.name
            );
            if position > 0 {
                text.push(',');
            }
            let _ = write!(text, "{}=\"{}\"", label.name, escape_label(label.value));
        }
        text.push('}');
    }
    let _ = writeln!(text, " {}", format_value(value));
}

/// A value as the format spells it (`+Inf`, `-Inf` and `NaN` for the
/// special reals, which Rust would print as `inf`).
fn format_value(value: SampleValue) -> String {
    match value {
        SampleValue::Integer(value) => value.to_string(),
        SampleValue::Real(value) if value.is_nan() => "NaN".to_string(),
        SampleValue::Real(value) if value.is_infinite() => {
            if value > 0.0 { "+Inf" } else { "-Inf" }.to_string()
        }
        SampleValue::Real(value) => value.to_string(),
    }
}

/// A label value: backslash, double quote and line feed escaped.
pub fn escape_label(value: &str) -> String {
    let mut escaped = String::with_capacity(value.len());
    for character in value.chars() {
        match character {
            '\\' => escaped.push_str("\\\\"),
            '"' => escaped.push_str("\\\""),
            '\n' => escaped.push_str("\\n"),
            other => escaped.push(other),
        }
    }
    escaped
}

/// A help text: backslash and line feed escaped.
fn escape_help(help: &str) -> String {
    help.replace('\\', "\\\\").replace('\n', "\\n")
}

/// `[a-zA-Z_:][a-zA-Z0-9_:]*`.
fn valid_name(name: &str) -> bool {
    let mut characters = name.chars();
    characters
        .next()
        .is_some_and(|first| first.is_ascii_alphabetic() || first == '_' || first == ':')
        && characters.all(|character| character.is_ascii_alphanumeric() || "_:".contains(character))
}

/// `[a-zA-Z_][a-zA-Z0-9_]*`, not starting with the reserved `__`.
fn valid_label_name(name: &str) -> bool {
    !name.starts_with("__") && !name.contains(':') && valid_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_write_their_header_once_and_escape_label_values() {
        let mut exposition = Exposition::new();
        exposition
            .counter("lamina_things_total", "Things, with a \\ and a\nline.")
            .sample(&[label("volume", "a\"b\\c\nd")], 3u64)
            .sample(&[label("volume", "plain")], 4u64);
        exposition
            .gauge("lamina_ratio", "A ratio.")
            .sample(&[], 0.25)
            .sample(&[label("kind", "nan")], f64::NAN)
            .sample(&[label("kind", "up")], f64::INFINITY)
            .sample(&[label("kind", "flag")], true);
        assert_eq!(
            exposition.into_text(),
            "# HELP lamina_things_total Things, with a \\\\ and a\\nline.\n\
             # TYPE lamina_things_total counter\n\
             lamina_things_total{volume=\"a\\\"b\\\\c\\nd\"} 3\n\
             lamina_things_total{volume=\"plain\"} 4\n\
             # HELP lamina_ratio A ratio.\n\
             # TYPE lamina_ratio gauge\n\
             lamina_ratio 0.25\n\
             lamina_ratio{kind=\"nan\"} NaN\n\
             lamina_ratio{kind=\"up\"} +Inf\n\
             lamina_ratio{kind=\"flag\"} 1\n"
        );
    }

    #[test]
    fn a_histogram_writes_buckets_sum_and_count() {
        let mut exposition = Exposition::new();
        let series = HistogramSeries {
            buckets: vec![
                Bucket {
                    upper_bound: 0.5,
                    cumulative_count: 1,
                },
                Bucket {
                    upper_bound: 1.0,
                    cumulative_count: 1,
                },
            ],
            sum: 2.25,
            count: 2,
        };
        exposition
            .histogram("lamina_wait_seconds", "Waits.")
            .series(&[label("op", "read")], &series);
        assert_eq!(
            exposition.into_text(),
            "# HELP lamina_wait_seconds Waits.\n\
             # TYPE lamina_wait_seconds histogram\n\
             lamina_wait_seconds_bucket{op=\"read\",le=\"0.5\"} 1\n\
             lamina_wait_seconds_bucket{op=\"read\",le=\"1\"} 1\n\
             lamina_wait_seconds_bucket{op=\"read\",le=\"+Inf\"} 2\n\
             lamina_wait_seconds_sum{op=\"read\"} 2.25\n\
             lamina_wait_seconds_count{op=\"read\"} 2\n"
        );
    }

    #[test]
    #[should_panic(expected = "must end in _total")]
    fn a_counter_without_total_is_refused() {
        Exposition::new().counter("lamina_relocated_blocks", "Blocks.");
    }

    #[test]
    #[should_panic(expected = "must not end in _total")]
    fn a_gauge_with_total_is_refused() {
        Exposition::new().gauge("lamina_waits_total", "Waits.");
    }

    #[test]
    #[should_panic(expected = "written twice")]
    fn a_family_is_written_once() {
        let mut exposition = Exposition::new();
        exposition.gauge("lamina_a", "A.");
        exposition.gauge("lamina_a", "A.");
    }
}
