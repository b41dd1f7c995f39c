//! The redundancy schemes a tier's devices can be put under, named the way
//! zpool and mdadm name them, with how many columns of a row each gives to
//! data and to parity.

use serde::{Deserialize, Serialize};

/// How a tier's devices protect each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Redundancy {
    /// Striped without parity: any lost device loses data (raid0; with one
    /// device, the device itself).
    None,
    /// Every block on every device.
    Mirror,
    /// One parity column per row: any one device may be lost.
    Raid5,
    /// Two parity columns per row (P and Q): any two devices may be lost.
    Raid6,
}

/// Devices one tier may have at most: rows are at most this wide.
pub const MEMBER_COUNT_MAX: usize = 64;

impl Redundancy {
    pub const ALL: [Redundancy; 4] = [Self::None, Self::Mirror, Self::Raid5, Self::Raid6];

    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Mirror => "mirror",
            Self::Raid5 => "raid5",
            Self::Raid6 => "raid6",
        }
    }

    /// Parses a name as [`Redundancy::name`] gives it.
    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|scheme| scheme.name() == text)
    }

    /// Devices the scheme needs at least.
    pub fn member_count_min(self) -> usize {
        match self {
            Self::None => 1,
            Self::Mirror => 2,
            Self::Raid5 => 3,
            Self::Raid6 => 4,
        }
    }

    /// Parity (or copy) columns per row over `member_count` devices: how many
    /// devices may be lost without losing data.
    pub fn parity_columns(self, member_count: usize) -> usize {
        match self {
            Self::None => 0,
            Self::Mirror => member_count - 1,
            Self::Raid5 => 1,
            Self::Raid6 => 2,
        }
    }

    /// Data columns per row over `member_count` devices.
    pub fn data_columns(self, member_count: usize) -> usize {
        member_count - self.parity_columns(member_count)
    }
}

impl std::fmt::Display for Redundancy {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_columns_add_up() {
        for scheme in Redundancy::ALL {
            assert_eq!(Redundancy::parse(scheme.name()), Some(scheme));
            for members in scheme.member_count_min()..=MEMBER_COUNT_MAX {
                let data = scheme.data_columns(members);
                assert!(data >= 1);
                assert_eq!(data + scheme.parity_columns(members), members);
            }
        }
        assert_eq!(Redundancy::parse("raid7"), None);
        assert_eq!(Redundancy::Raid6.data_columns(6), 4);
        assert_eq!(Redundancy::Mirror.data_columns(3), 1);
    }
}
