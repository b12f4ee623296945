//! The pipeline schedules by their rules alone: the order in which each
//! stage runs its micro-batches' forwards and backwards under GPipe
//! (exercise 21) and 1F1B (exercise 24), and where each lands in time when
//! every forward and every backward takes one slot and starts as soon as
//! its input has arrived. The idealised slot chart is drawn from it, and the
//! measured one names its bars by it.

use std::collections::HashMap;
use std::fmt;

/// A pipelined step's schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schedule {
    /// Every forward, then every backward, the last micro-batch's first:
    /// the order in which the stage after sent their gradients back.
    GPipe,
    /// Stage s runs min(S − s, M) forwards (its warm-up), then a backward
    /// whenever one can come back and a forward after each while any is
    /// left, so it never holds more than S − s micro-batches.
    OneFOneB,
}

/// A forward or a backward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Pass {
    Forward,
    Backward,
}

/// One pass of one micro-batch on a stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Op {
    pub pass: Pass,
    pub micro_batch: usize,
}

/// A stage's op and the slot it starts in.
pub type Slot = (usize, Op);

impl Schedule {
    /// The order in which stage `stage` of `stages` runs the forwards and
    /// backwards of `micro_batches` micro-batches.
    pub fn order(self, stage: usize, stages: usize, micro_batches: usize) -> Vec<Op> {
        let forward = |micro_batch| Op { pass: Pass::Forward, micro_batch };
        let backward = |micro_batch| Op { pass: Pass::Backward, micro_batch };
        match self {
            Self::GPipe => (0..micro_batches).map(forward).chain((0..micro_batches).rev().map(backward)).collect(),
            Self::OneFOneB => {
                let warm_up = (stages - stage).min(micro_batches);
                let mut order: Vec<Op> = (0..warm_up).map(forward).collect();
                for m in 0..micro_batches {
                    order.push(backward(m));
                    if warm_up + m < micro_batches {
                        order.push(forward(warm_up + m));
                    }
                }
                order
            }
        }
    }

    /// Each stage's ops with the slot each starts in, when every op takes
    /// one slot and starts once the stage is free and its input is there: a
    /// forward's from the stage before, a backward's from the stage after
    /// (the last stage's backward needs only its own forward, before it).
    pub fn slots(self, stages: usize, micro_batches: usize) -> Vec<Vec<Slot>> {
        let orders: Vec<Vec<Op>> = (0..stages).map(|s| self.order(s, stages, micro_batches)).collect();
        let mut ends: HashMap<(usize, Op), usize> = HashMap::new();
        let mut slots: Vec<Vec<Slot>> = vec![vec![]; stages];
        let mut free = vec![0; stages];
        while slots.iter().zip(&orders).any(|(placed, order)| placed.len() < order.len()) {
            let mut progressed = false;
            for stage in 0..stages {
                while let Some(&op) = orders[stage].get(slots[stage].len()) {
                    let from = match op.pass {
                        Pass::Forward => stage.checked_sub(1),
                        Pass::Backward => Some(stage + 1).filter(|&s| s < stages),
                    };
                    let arrived = match from.map(|s| ends.get(&(s, op))) {
                        None => 0,
                        Some(Some(&end)) => end,
                        Some(None) => break,
                    };
                    let start = free[stage].max(arrived);
                    free[stage] = start + 1;
                    ends.insert((stage, op), start + 1);
                    slots[stage].push((start, op));
                    progressed = true;
                }
            }
            assert!(progressed, "{self}'s orders wait on each other: the rules above are wrong");
        }
        slots
    }
}

/// The share of the stages' time idle in `slots`, the step lasting from
/// slot 0 to the end of the last op.
pub fn bubble(slots: &[Vec<Slot>]) -> f64 {
    let end = slots.iter().flatten().map(|(start, _)| start + 1).max().unwrap_or(0);
    let busy: usize = slots.iter().map(Vec::len).sum();
    if end == 0 {
        0.0
    } else {
        1.0 - busy as f64 / (slots.len() * end) as f64
    }
}

/// `GPipe`, `1F1B`.
impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::GPipe => "GPipe",
            Self::OneFOneB => "1F1B",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The forwards stage `stage` runs before its first backward.
    fn warm_up(schedule: Schedule, stage: usize, stages: usize, micro_batches: usize) -> usize {
        schedule.order(stage, stages, micro_batches).iter().take_while(|op| op.pass == Pass::Forward).count()
    }

    /// The most micro-batches a stage holds between forward and backward.
    fn most_held(order: &[Op]) -> usize {
        let mut held = 0usize;
        let mut most = 0;
        for op in order {
            held = if op.pass == Pass::Forward { held + 1 } else { held - 1 };
            most = most.max(held);
        }
        most
    }

    #[test]
    fn one_f_one_b_warms_up_with_one_forward_per_stage_from_this_one_to_the_last() {
        for (stages, micro_batches) in [(4, 8), (4, 2), (3, 4), (1, 3)] {
            for stage in 0..stages {
                let expected = (stages - stage).min(micro_batches);
                assert_eq!(warm_up(Schedule::OneFOneB, stage, stages, micro_batches), expected);
                let order = Schedule::OneFOneB.order(stage, stages, micro_batches);
                assert_eq!(most_held(&order), expected, "stage {stage} of {stages} holds more than its warm-up");
            }
        }
    }

    #[test]
    fn gpipe_runs_every_forward_first_and_holds_every_micro_batch() {
        for stage in 0..4 {
            assert_eq!(warm_up(Schedule::GPipe, stage, 4, 8), 8);
            assert_eq!(most_held(&Schedule::GPipe.order(stage, 4, 8)), 8);
        }
    }

    #[test]
    fn both_schedules_idle_the_stages_p_minus_1_of_m_plus_p_minus_1_slots() {
        for schedule in [Schedule::GPipe, Schedule::OneFOneB] {
            for (stages, micro_batches) in [(4, 8), (3, 4), (4, 2), (2, 16), (1, 5)] {
                let expected = (stages - 1) as f64 / (micro_batches + stages - 1) as f64;
                let got = bubble(&schedule.slots(stages, micro_batches));
                assert!((got - expected).abs() < 1e-12, "{schedule}, p {stages}, m {micro_batches}: {got}");
            }
        }
    }

    #[test]
    fn the_chapters_traces_are_the_rules_slots() {
        // Exercise 21's and 24's traces for S = 3, M = 4: stage 0's slots.
        let starts = |schedule: Schedule| -> Vec<(usize, &str, usize)> {
            let named = |op: &Op| if op.pass == Pass::Forward { "F" } else { "B" };
            schedule.slots(3, 4)[0].iter().map(|(start, op)| (*start, named(op), op.micro_batch)).collect()
        };
        let gpipe = [(0, "F", 0), (1, "F", 1), (2, "F", 2), (3, "F", 3), (8, "B", 3), (9, "B", 2), (10, "B", 1)];
        assert_eq!(starts(Schedule::GPipe)[..7], gpipe);
        let one_f_one_b = [(0, "F", 0), (1, "F", 1), (2, "F", 2), (5, "B", 0), (6, "F", 3), (7, "B", 1), (9, "B", 2)];
        assert_eq!(starts(Schedule::OneFOneB)[..7], one_f_one_b);
    }
}
