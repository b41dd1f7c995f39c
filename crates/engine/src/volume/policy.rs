//! Tier policies: how much a volume's data deserves flash and where it is
//! pinned. The domain types here are what the pool, the tiering code and the
//! control API use; the log encodes them as `log::batch::PolicyRecord`, and the
//! conversions between the two live here, so that the format never depends on
//! the domain.

use serde::Serialize;

use crate::log::batch::{CachePriorityRecord, PinRecord, PolicyRecord};

/// How much a volume's data deserves flash in a two-tier pool, relative to
/// other volumes' (see `tier::heat`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CachePriority {
    /// Promoted on first access from capacity and kept on flash longest.
    High,
    #[default]
    Normal,
    /// Promoted only after repeated accesses, demoted first.
    Low,
    /// Never promoted; demoted at the first cleaning of its segment.
    None,
}

/// Where a volume's blocks are kept regardless of heat.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Pin {
    /// By heat and priority.
    #[default]
    Auto,
    /// Never demoted; promoted on first access.
    Flash,
    /// Demoted at the first cleaning, never promoted. New writes still land on
    /// flash first (the log is written there).
    Capacity,
}

/// A volume's tier policy: settable at create time and live.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
pub struct TierPolicy {
    pub priority: CachePriority,
    pub pin: Pin,
}

impl std::str::FromStr for CachePriority {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "high" => Ok(Self::High),
            "normal" => Ok(Self::Normal),
            "low" => Ok(Self::Low),
            "none" => Ok(Self::None),
            _ => Err(format!(
                "unknown cache priority {text:?} (expected high, normal, low or none)"
            )),
        }
    }
}

impl std::str::FromStr for Pin {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "auto" => Ok(Self::Auto),
            "flash" => Ok(Self::Flash),
            "capacity" => Ok(Self::Capacity),
            _ => Err(format!(
                "unknown pin {text:?} (expected auto, flash or capacity)"
            )),
        }
    }
}

impl std::fmt::Display for CachePriority {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(match self {
            Self::High => "high",
            Self::Normal => "normal",
            Self::Low => "low",
            Self::None => "none",
        })
    }
}

impl std::fmt::Display for Pin {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(match self {
            Self::Auto => "auto",
            Self::Flash => "flash",
            Self::Capacity => "capacity",
        })
    }
}

impl From<TierPolicy> for PolicyRecord {
    fn from(policy: TierPolicy) -> Self {
        Self {
            priority: match policy.priority {
                CachePriority::High => CachePriorityRecord::High,
                CachePriority::Normal => CachePriorityRecord::Normal,
                CachePriority::Low => CachePriorityRecord::Low,
                CachePriority::None => CachePriorityRecord::None,
            },
            pin: match policy.pin {
                Pin::Auto => PinRecord::Auto,
                Pin::Flash => PinRecord::Flash,
                Pin::Capacity => PinRecord::Capacity,
            },
        }
    }
}

impl From<PolicyRecord> for TierPolicy {
    fn from(record: PolicyRecord) -> Self {
        Self {
            priority: match record.priority {
                CachePriorityRecord::High => CachePriority::High,
                CachePriorityRecord::Normal => CachePriority::Normal,
                CachePriorityRecord::Low => CachePriority::Low,
                CachePriorityRecord::None => CachePriority::None,
            },
            pin: match record.pin {
                PinRecord::Auto => Pin::Auto,
                PinRecord::Flash => Pin::Flash,
                PinRecord::Capacity => Pin::Capacity,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PRIORITIES: [CachePriority; 4] = [
        CachePriority::High,
        CachePriority::Normal,
        CachePriority::Low,
        CachePriority::None,
    ];
    const PINS: [Pin; 3] = [Pin::Auto, Pin::Flash, Pin::Capacity];

    /// The log used to encode `TierPolicy` itself: its record must give the
    /// same bytes for every policy, and convert back to the same policy.
    #[test]
    fn every_policy_encodes_as_before_and_round_trips() {
        for priority in PRIORITIES {
            for pin in PINS {
                let policy = TierPolicy { priority, pin };
                let record = PolicyRecord::from(policy);
                assert_eq!(
                    postcard::to_allocvec(&record).unwrap(),
                    postcard::to_allocvec(&policy).unwrap(),
                    "{policy:?}"
                );
                assert_eq!(TierPolicy::from(record), policy);
            }
        }
        assert_eq!(
            PolicyRecord::from(TierPolicy::default()),
            PolicyRecord::default()
        );
    }
}
