//! Human sizes on the command line and in config, the one parser of them for
//! every lamina command (`lamina pool create`, `lamina bench ...`) and the
//! daemon's config: plain bytes (`4096`), or a whole number with a binary unit,
//! case-insensitive and optionally followed by `B` or `iB`: `K`, `M`, `G`, `T`,
//! `P` (`512k`, `64M`, `10GB`, `1TiB`). Units are binary (K = 1024), as storage
//! engineers expect of device sizes; `B` alone means bytes.

/// Parses a size in bytes.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|character: char| !character.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (digits, suffix) = trimmed.split_at(split);
    let number: u64 = digits.parse().map_err(|_| {
        format!("invalid size {text:?}: expected a number with an optional K, M, G, T or P suffix, as in 20G")
    })?;
    let shift = match suffix.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        "P" | "PB" | "PIB" => 50,
        other => {
            return Err(format!(
                "invalid size {text:?}: unknown suffix {other:?} (use K, M, G, T or P, as in 20G)"
            ));
        }
    };
    number
        .checked_mul(1u64 << shift)
        .ok_or_else(|| format!("invalid size {text:?}: too large"))
}

/// Formats bytes with a binary suffix, for tables.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_and_bad_ones_are_refused() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size(" 4096 "), Ok(4096));
        assert_eq!(parse_size("7b"), Ok(7));
        assert_eq!(parse_size("10G"), Ok(10 << 30));
        assert_eq!(parse_size("512k"), Ok(512 << 10));
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("64mb"), Ok(64 << 20));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("1TiB"), Ok(1 << 40));
        assert_eq!(parse_size("1p"), Ok(1 << 50));
        assert!(parse_size("ten").is_err());
        assert!(parse_size("G").is_err());
        assert!(parse_size("10X").is_err());
        assert!(parse_size("1.5G").is_err());
        assert!(parse_size("99999999999P").is_err());
        assert_eq!(format_size(10 << 30), "10.0 GiB");
        assert_eq!(format_size(512), "512 B");
    }
}
