//! How a batch of reads is carried through the client's bounce buffer:
//! in rounds, each at most `capacity` bytes and `out.len()` reads posted
//! together (one doorbell's worth), a read longer than the room left split
//! across rounds. Pure, allocation-free, and tested without a fabric.

/// Part (or all) of one read of the batch: `len` bytes of read `op` from
/// its byte `op_offset`, landing at `bounce_offset` in the bounce buffer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Piece {
    pub op: usize,
    pub op_offset: usize,
    pub len: usize,
    pub bounce_offset: usize,
}

/// Where the next round starts: read `op`, from its byte `done`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cursor {
    pub op: usize,
    pub done: usize,
}

/// Fills `out` with the next round's pieces for reads whose lengths
/// `len_of` gives (`None` past the last) and returns how many; 0 once every
/// read is planned. Empty reads need no piece.
pub fn next_round(
    len_of: impl Fn(usize) -> Option<usize>,
    cursor: &mut Cursor,
    capacity: usize,
    out: &mut [Piece],
) -> usize {
    let mut used = 0;
    let mut count = 0;
    while count < out.len() && used < capacity {
        let Some(len) = len_of(cursor.op) else {
            break;
        };
        let left = len - cursor.done.min(len);
        if left == 0 {
            *cursor = Cursor {
                op: cursor.op + 1,
                done: 0,
            };
            continue;
        }
        let take = left.min(capacity - used);
        out[count] = Piece {
            op: cursor.op,
            op_offset: cursor.done,
            len: take,
            bounce_offset: used,
        };
        count += 1;
        used += take;
        cursor.done += take;
    }
    count
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_rounds(lens: &[usize], capacity: usize, max_ops: usize) -> Vec<Vec<Piece>> {
        let mut cursor = Cursor::default();
        let mut rounds = Vec::new();
        let mut out = vec![Piece::default(); max_ops];
        loop {
            let n = next_round(|i| lens.get(i).copied(), &mut cursor, capacity, &mut out);
            if n == 0 {
                return rounds;
            }
            rounds.push(out[..n].to_vec());
        }
    }

    #[test]
    fn small_reads_share_one_round() {
        let rounds = all_rounds(&[8, 0, 16], 64, 4);
        assert_eq!(rounds.len(), 1);
        assert_eq!(
            rounds[0],
            vec![
                Piece {
                    op: 0,
                    op_offset: 0,
                    len: 8,
                    bounce_offset: 0
                },
                Piece {
                    op: 2,
                    op_offset: 0,
                    len: 16,
                    bounce_offset: 8
                },
            ]
        );
    }

    #[test]
    fn a_long_read_is_split_and_the_op_limit_starts_a_new_round() {
        let rounds = all_rounds(&[100, 10, 10, 10], 64, 2);
        let flat: Vec<(usize, usize, usize)> = rounds
            .iter()
            .flatten()
            .map(|p| (p.op, p.op_offset, p.len))
            .collect();
        assert_eq!(
            flat,
            vec![(0, 0, 64), (0, 64, 36), (1, 0, 10), (2, 0, 10), (3, 0, 10)]
        );
        assert_eq!(rounds.len(), 3);
        for round in &rounds {
            assert!(round.len() <= 2);
            assert!(round.iter().map(|p| p.len).sum::<usize>() <= 64);
        }
    }

    #[test]
    fn every_byte_is_planned_once_within_capacity() {
        let lens = [0, 1, 63, 64, 65, 200, 3];
        for capacity in [1, 7, 64, 300] {
            for max_ops in [1, 3, 16] {
                let mut covered: Vec<usize> = vec![0; lens.len()];
                for round in all_rounds(&lens, capacity, max_ops) {
                    let mut end = 0;
                    for p in &round {
                        assert_eq!(p.op_offset, covered[p.op], "pieces in order");
                        assert_eq!(p.bounce_offset, end, "packed");
                        covered[p.op] += p.len;
                        end += p.len;
                    }
                    assert!(end <= capacity && round.len() <= max_ops);
                }
                assert_eq!(covered, lens);
            }
        }
    }
}
