//! Command-line lookup the model's examples share.
//! Included with `#[path = "common/mod.rs"] mod common;` (an example
//! directory without `main.rs` is not an example of its own).

/// The value after `name` on the command line, or `default`.
pub fn argument(name: &str, default: &str) -> String {
    let arguments: Vec<String> = std::env::args().collect();
    arguments
        .iter()
        .position(|argument| argument == name)
        .and_then(|index| arguments.get(index + 1).cloned())
        .unwrap_or_else(|| default.to_string())
}
