//! Ranks as threads of one process: [`LocalGroup::new`] makes one [`LocalComm`] per rank, all
//! sharing one exchange in memory. CI runs tensor and data parallelism with these on the CPU
//! backend; the collectives are [`Collectives`]' defaults (rank-order reductions), so every rank
//! gets bitwise the same result.
//!
//! One round of the exchange, a reusable barrier with a payload:
//!
//! ```text
//!  Collecting: each rank puts its bytes in its slot ─► the last to arrive moves the slots into
//!              `result` and switches to Reading
//!  Reading:    each rank clones `result` and counts itself out ─► the last reader clears it and
//!              switches back to Collecting (the next round may start)
//! ```
//!
//! A [`LocalComm`] dropped before its group is done (its thread failed or returned) marks its
//! rank departed: collectives that need it fail with an error naming it, so a failing rank never
//! leaves the others blocked.

use super::{Collectives, Communicator};
use crate::backend::Backend;
use anyhow::{bail, Result};
use std::sync::{Arc, Condvar, Mutex};

/// The shared exchange of one group.
struct Exchange {
    size: usize,
    state: Mutex<Round>,
    changed: Condvar,
}

#[derive(Default)]
struct Round {
    reading: bool,
    slots: Vec<Option<Vec<u8>>>,
    arrived: usize,
    result: Option<Arc<Vec<Vec<u8>>>>,
    readers_left: usize,
    departed: Vec<bool>,
    /// Why the group can no longer run a collective (the first departure seen), so every
    /// remaining rank reports the same cause.
    broken: Option<String>,
}

/// One rank's handle on an in-process group.
pub struct LocalComm {
    rank: usize,
    exchange: Arc<Exchange>,
}

/// Makes in-process groups.
pub struct LocalGroup;

impl LocalGroup {
    /// A group of `size` ranks: handle `r` is rank `r`'s (move it to that rank's thread).
    #[allow(clippy::new_ret_no_self)] // a group is its ranks' handles
    pub fn new(size: usize) -> Vec<LocalComm> {
        assert!(size > 0, "a group needs a rank");
        let exchange = Arc::new(Exchange {
            size,
            state: Mutex::new(Round {
                slots: vec![None; size],
                departed: vec![false; size],
                ..Default::default()
            }),
            changed: Condvar::new(),
        });
        (0..size)
            .map(|rank| LocalComm {
                rank,
                exchange: exchange.clone(),
            })
            .collect()
    }
}

/// One rank's place in an in-process grid of `dp` replicas of `tp` tensor-parallel ranks: its
/// tensor-parallel group (the replica's ranks) and data-parallel group (the same rank in every
/// replica).
pub struct GridRank {
    pub replica: usize,
    pub tp: LocalComm,
    pub dp: LocalComm,
}

impl LocalGroup {
    /// Every rank of a `dp x tp` grid, replica-major (rank `replica * tp + tp_rank`).
    pub fn grid(dp: usize, tp: usize) -> Vec<GridRank> {
        let mut tp_groups: Vec<std::vec::IntoIter<LocalComm>> =
            (0..dp).map(|_| LocalGroup::new(tp).into_iter()).collect();
        let mut dp_groups: Vec<std::vec::IntoIter<LocalComm>> =
            (0..tp).map(|_| LocalGroup::new(dp).into_iter()).collect();
        let mut ranks = Vec::with_capacity(dp * tp);
        for (replica, tp_group) in tp_groups.iter_mut().enumerate() {
            for dp_group in dp_groups.iter_mut() {
                ranks.push(GridRank {
                    replica,
                    tp: tp_group.next().expect("one handle per rank"),
                    dp: dp_group.next().expect("one handle per replica"),
                });
            }
        }
        ranks
    }
}

impl Collectives for LocalComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.exchange.size
    }

    fn all_gather_bytes(&self, local: &[u8]) -> Result<Vec<Vec<u8>>> {
        let ex = &*self.exchange;
        if ex.size == 1 {
            return Ok(vec![local.to_vec()]);
        }
        let lock = |guard| ex.changed.wait(guard).expect("exchange lock poisoned");
        let mut round = ex.state.lock().expect("exchange lock poisoned");
        if let Some(why) = &round.broken {
            bail!("{why}");
        }
        // The previous round's readers must be done before this round's slots fill.
        while round.reading {
            round = lock(round);
        }
        round.slots[self.rank] = Some(local.to_vec());
        round.arrived += 1;
        if round.arrived == ex.size {
            let slots = std::mem::replace(&mut round.slots, vec![None; ex.size]);
            round.result = Some(Arc::new(slots.into_iter().map(Option::unwrap).collect()));
            round.arrived = 0;
            round.readers_left = ex.size;
            round.reading = true;
            ex.changed.notify_all();
        } else {
            while !round.reading {
                if round.broken.is_none() {
                    if let Some(gone) = missing_departed(&round) {
                        round.broken = Some(format!(
                            "collective: rank {gone} of {} left the group (it failed or stopped) \
                             before this collective",
                            ex.size
                        ));
                    }
                }
                if let Some(why) = round.broken.clone() {
                    round.slots[self.rank] = None;
                    round.arrived -= 1;
                    ex.changed.notify_all();
                    bail!("{why}");
                }
                round = lock(round);
            }
        }
        let result = round
            .result
            .clone()
            .expect("a round being read has a result");
        round.readers_left -= 1;
        if round.readers_left == 0 {
            round.result = None;
            round.reading = false;
            ex.changed.notify_all();
        }
        drop(round);
        Ok(result.as_ref().clone())
    }
}

/// A departed rank that has not put its bytes into the round being collected.
fn missing_departed(round: &Round) -> Option<usize> {
    (0..round.departed.len()).find(|&r| round.departed[r] && round.slots[r].is_none())
}

impl Drop for LocalComm {
    fn drop(&mut self) {
        if let Ok(mut round) = self.exchange.state.lock() {
            round.departed[self.rank] = true;
            self.exchange.changed.notify_all();
        }
    }
}

impl<B: Backend> Communicator<B> for LocalComm {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dist::ReduceOp;

    fn on_ranks<R: Send>(size: usize, f: impl Fn(LocalComm) -> R + Sync) -> Vec<R> {
        let comms = LocalGroup::new(size);
        std::thread::scope(|s| {
            let f = &f;
            let handles: Vec<_> = comms.into_iter().map(|c| s.spawn(move || f(c))).collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn reductions_are_in_rank_order_and_equal_on_every_rank() {
        // 1e8 + 1 + -1e8 in f32: (1e8 + 1) rounds to 1e8, so rank order gives 0, another order 1.
        let values = [1.0e8f32, 1.0, -1.0e8];
        let results = on_ranks(3, |c| {
            let mut v = vec![values[c.rank()], c.rank() as f32];
            for _ in 0..50 {
                let mut w = v.clone();
                c.all_reduce_f32(&mut w, ReduceOp::Sum).unwrap();
                assert_eq!(w, vec![0.0, 3.0]);
            }
            c.all_reduce_f32(&mut v, ReduceOp::Max).unwrap();
            v
        });
        for r in &results {
            assert_eq!(r, &vec![1.0e8, 2.0]);
        }
    }

    #[test]
    fn gathers_scatters_and_broadcasts() {
        let results = on_ranks(4, |c| {
            let r = c.rank();
            let gathered = c.all_gather_f64(&[r as f64, 10.0 * r as f64]).unwrap();
            assert_eq!(gathered, vec![0., 0., 1., 10., 2., 20., 3., 30.]);
            let full: Vec<f32> = (0..8).map(|i| (i * (r + 1)) as f32).collect();
            let part = c.reduce_scatter_f32(&full).unwrap();
            // sum over ranks of i * (r + 1) = 10 i; rank r keeps i = 2r, 2r + 1.
            assert_eq!(part, vec![20.0 * r as f32, 10.0 * (2 * r + 1) as f32]);
            let mut bytes = if r == 2 { b"from two".to_vec() } else { vec![] };
            c.broadcast_bytes(&mut bytes, 2).unwrap();
            bytes
        });
        assert!(results.iter().all(|b| b == b"from two"));
    }

    #[test]
    fn a_departed_rank_fails_the_others_instead_of_blocking_them() {
        let results = on_ranks(3, |c| {
            c.barrier().unwrap();
            if c.rank() == 1 {
                drop(c);
                return None;
            }
            Some(format!("{:#}", c.barrier().unwrap_err()))
        });
        for message in results.into_iter().flatten() {
            assert!(message.contains("rank 1 of 3 left the group"), "{message}");
        }
    }
}
