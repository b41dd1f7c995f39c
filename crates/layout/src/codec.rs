//! Parity: computing a row's parity columns from its data columns, and any
//! lost data columns from what is left. raid5 and raid6 use Reed-Solomon over
//! GF(2^8) from the `reed-solomon-erasure` crate with its `simd-accel` kernels
//! (systematic, so data columns are stored as they are); a mirror's "parity" is copies. (`reed-solomon-simd`
//! encodes as fast but needs about 0.2–0.9 ms to decode one 4 KiB row of a
//! 4+2 code, a fixed cost of its transform over GF(2^16) that a degraded read
//! pays per row; see BENCHMARKS.md.) Columns may hold many rows at
//! once (each column the concatenation of its blocks in row order): the code
//! works position by position, so encoding rows together equals encoding
//! them one by one (a test checks it).

use std::sync::Arc;

use reed_solomon_erasure::galois_8::ReedSolomon;

use crate::redundancy::Redundancy;

/// Parity could not be computed or data not restored.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error(
        "{available} of {needed} columns needed to restore the data are left ({redundancy} over {member_count} devices)"
    )]
    TooFewColumns {
        redundancy: Redundancy,
        member_count: usize,
        available: usize,
        needed: usize,
    },
    #[error("parity library: {0:?}")]
    Library(reed_solomon_erasure::Error),
}

impl From<reed_solomon_erasure::Error> for CodecError {
    fn from(error: reed_solomon_erasure::Error) -> Self {
        Self::Library(error)
    }
}

/// The code of one array (its matrices built once).
#[derive(Clone, Debug)]
pub struct ParityCodec {
    redundancy: Redundancy,
    member_count: usize,
    /// raid5 and raid6 only.
    reed_solomon: Option<Arc<ReedSolomon>>,
}

impl ParityCodec {
    pub fn new(redundancy: Redundancy, member_count: usize) -> Self {
        assert!(member_count >= redundancy.member_count_min());
        let reed_solomon = matches!(redundancy, Redundancy::Raid5 | Redundancy::Raid6).then(|| {
            let data = redundancy.data_columns(member_count);
            let parity = redundancy.parity_columns(member_count);
            Arc::new(
                ReedSolomon::new(data, parity)
                    .expect("data and parity counts within GF(2^8)'s 256 columns"),
            )
        });
        Self {
            redundancy,
            member_count,
            reed_solomon,
        }
    }

    fn reed_solomon(&self) -> &ReedSolomon {
        self.reed_solomon
            .as_deref()
            .expect("raid5 and raid6 have a Reed-Solomon code")
    }

    pub fn data_columns(&self) -> usize {
        self.redundancy.data_columns(self.member_count)
    }

    pub fn parity_columns(&self) -> usize {
        self.redundancy.parity_columns(self.member_count)
    }

    /// The parity columns of `data` (all the same length, a multiple of 64
    /// bytes).
    pub fn encode(&self, data: &[&[u8]]) -> Result<Vec<Vec<u8>>, CodecError> {
        assert_eq!(data.len(), self.data_columns());
        let length = data[0].len();
        assert!(data.iter().all(|column| column.len() == length));
        Ok(match self.redundancy {
            Redundancy::None => Vec::new(),
            Redundancy::Mirror => vec![data[0].to_vec(); self.parity_columns()],
            Redundancy::Raid5 | Redundancy::Raid6 => {
                let mut parity = vec![vec![0_u8; length]; self.parity_columns()];
                self.reed_solomon().encode_sep(data, &mut parity)?;
                parity
            }
        })
    }

    /// Restores the data columns from `columns` (data columns first, then
    /// parity; `None` where lost). Returns every data column.
    pub fn reconstruct(&self, columns: &[Option<&[u8]>]) -> Result<Vec<Vec<u8>>, CodecError> {
        assert_eq!(columns.len(), self.member_count);
        let data_columns = self.data_columns();
        let available = columns.iter().filter(|column| column.is_some()).count();
        if available < data_columns {
            return Err(CodecError::TooFewColumns {
                redundancy: self.redundancy,
                member_count: self.member_count,
                available,
                needed: data_columns,
            });
        }
        let (data, parity) = columns.split_at(data_columns);
        if data.iter().all(Option::is_some) {
            return Ok(data.iter().map(|column| column.unwrap().to_vec()).collect());
        }
        match self.redundancy {
            Redundancy::None => unreachable!("no parity: every data column is needed above"),
            Redundancy::Mirror => {
                let copy = columns.iter().flatten().next().expect("checked above");
                Ok(vec![copy.to_vec()])
            }
            Redundancy::Raid5 | Redundancy::Raid6 => self.decode(data, parity),
        }
    }

    fn decode(
        &self,
        data: &[Option<&[u8]>],
        parity: &[Option<&[u8]>],
    ) -> Result<Vec<Vec<u8>>, CodecError> {
        let mut shards: Vec<Option<Vec<u8>>> = data
            .iter()
            .chain(parity)
            .map(|column| column.map(<[u8]>::to_vec))
            .collect();
        self.reed_solomon().reconstruct_data(&mut shards)?;
        Ok(shards
            .into_iter()
            .take(self.data_columns())
            .map(|column| column.expect("the library restores every data column"))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};

    use super::*;

    fn random_columns(count: usize, length: usize, seed: u64) -> Vec<Vec<u8>> {
        let mut random = rand::rngs::SmallRng::seed_from_u64(seed);
        (0..count)
            .map(|_| (0..length).map(|_| random.random()).collect())
            .collect()
    }

    /// Every way of losing as many columns as the scheme allows restores the
    /// data exactly.
    #[test]
    fn any_lost_columns_within_the_parity_are_restored() {
        for (redundancy, members) in [
            (Redundancy::Raid6, 6),
            (Redundancy::Raid6, 4),
            (Redundancy::Raid5, 3),
            (Redundancy::Raid5, 5),
            (Redundancy::Mirror, 3),
        ] {
            let codec = ParityCodec::new(redundancy, members);
            let data = random_columns(codec.data_columns(), 4096, members as u64);
            let slices: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
            let parity = codec.encode(&slices).unwrap();
            let all: Vec<&[u8]> = slices
                .iter()
                .copied()
                .chain(parity.iter().map(Vec::as_slice))
                .collect();
            for lost_mask in 0_u32..(1 << members) {
                let lost = lost_mask.count_ones() as usize;
                let columns: Vec<Option<&[u8]>> = (0..members)
                    .map(|index| (lost_mask & (1 << index) == 0).then_some(all[index]))
                    .collect();
                let result = codec.reconstruct(&columns);
                if lost <= codec.parity_columns() {
                    assert_eq!(result.unwrap(), data, "{redundancy} lost {lost_mask:b}");
                } else {
                    assert!(result.is_err(), "{redundancy} lost {lost_mask:b}");
                }
            }
        }
    }

    /// Columns of several rows encoded together give each row's own parity.
    #[test]
    fn rows_encoded_together_decode_one_by_one() {
        let codec = ParityCodec::new(Redundancy::Raid6, 6);
        let rows = 5;
        let data = random_columns(4, 4096 * rows, 7);
        let slices: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
        let parity = codec.encode(&slices).unwrap();
        for row in 0..rows {
            let range = row * 4096..(row + 1) * 4096;
            let mut columns: Vec<Option<&[u8]>> = data
                .iter()
                .chain(parity.iter())
                .map(|column| Some(&column[range.clone()]))
                .collect();
            columns[0] = None;
            columns[3] = None;
            let restored = codec.reconstruct(&columns).unwrap();
            assert_eq!(restored[0], data[0][range.clone()]);
            assert_eq!(restored[3], data[3][range.clone()]);
        }
    }

    /// An independent check of the parity (not through the library's own
    /// decoder): raid5's single parity column is linear, so the parity of the
    /// XOR of two rows is the XOR of their parities, and all-zero data has
    /// all-zero parity.
    #[test]
    fn parity_is_linear() {
        for (redundancy, members) in [(Redundancy::Raid5, 4), (Redundancy::Raid6, 6)] {
            let codec = ParityCodec::new(redundancy, members);
            let first = random_columns(codec.data_columns(), 4096, 1);
            let second = random_columns(codec.data_columns(), 4096, 2);
            let sum: Vec<Vec<u8>> = first
                .iter()
                .zip(&second)
                .map(|(a, b)| a.iter().zip(b).map(|(x, y)| x ^ y).collect())
                .collect();
            let parity_of = |columns: &[Vec<u8>]| {
                let slices: Vec<&[u8]> = columns.iter().map(Vec::as_slice).collect();
                codec.encode(&slices).unwrap()
            };
            let expected: Vec<Vec<u8>> = parity_of(&first)
                .iter()
                .zip(parity_of(&second))
                .map(|(a, b)| a.iter().zip(&b).map(|(x, y)| x ^ y).collect())
                .collect();
            assert_eq!(parity_of(&sum), expected);
            let zeros = vec![vec![0_u8; 4096]; codec.data_columns()];
            assert!(parity_of(&zeros).iter().flatten().all(|byte| *byte == 0));
        }
    }
}
