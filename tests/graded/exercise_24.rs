//! Exercise 24: a pipelined step on the 1F1B schedule, graded against one
//! process (see `pipeline_runs.rs`); here, the order 1F1B runs things in and
//! the micro-batches it holds in flight, compared with the schedules each
//! typical mistake gives.

use rstest::rstest;
use workbook::parallel::pipeline::StageOp;
use workbook::phase4_under_the_hood::one_f_one_b_step;

use crate::pipeline_runs::{
    bubble, expect_gradients_of_the_mean_loss, expect_it_runs_where_sends_wait,
    expect_one_send_per_micro_batch_and_cut, expect_the_mean_loss_on_the_last_stage, expect_the_same_across_processes,
    gpipe, most_in_flight, one_f_one_b, run, written, Schedule, M,
};
use crate::support::{cause, mistake};

const ONE_F_ONE_B: Schedule = Schedule {
    exercise: 24,
    name: "one_f_one_b_step",
    step: one_f_one_b_step,
    loss_summed: "loss_summed",
    loss_overwritten: "loss_overwritten",
    backward_from_one: "backward_from_one",
    gradients_not_accumulated: "gradients_not_accumulated",
    zero_share: "zero_share",
    input_not_a_var: None,
};

/// The typical mistake whose schedules `got` are, when exactly one mistake gives them.
fn schedule_mistake(got: &[Vec<StageOp>], m: usize) -> Option<&'static str> {
    let stages = got.len();
    let mistaken = |id: &str| -> Vec<Vec<StageOp>> {
        match (id, stages, m) {
            ("gpipe_schedule", _, _) => vec![gpipe(m); stages],
            ("no_warmup", _, _) => vec![[StageOp::Forward, StageOp::Backward].repeat(m); stages],
            ("warmup_one_too_many", 2, 4) => written(&["FFFBFBBB", "FFBFBFBB"]),
            ("warmup_one_too_many", 4, 4) => written(&["FFFFBBBB", "FFFFBBBB", "FFFBFBBB", "FFBFBFBB"]),
            ("warmup_one_too_many", 4, 2) => written(&["FFBB"; 4]),
            ("warmup_one_too_few", 2, 4) => written(&["FBFBFBFB"; 2]),
            // With fewer micro-batches than stages the count is capped at M, and the text's S − s − 1 would be untrue.
            ("warmup_one_too_few", 4, 4) => written(&["FFFBFBBB", "FFBFBFBB", "FBFBFBFB", "FBFBFBFB"]),
            ("same_warmup_everywhere", 2, 4) => written(&["FFBFBFBB"; 2]),
            ("same_warmup_everywhere", 4, 4) => written(&["FFFFBBBB"; 4]),
            ("same_warmup_everywhere", 4, 2) => written(&["FFBB"; 4]),
            ("cooldown_skipped", 2, 4) => written(&["FFBFBFB", "FBFBFBFB"]),
            ("cooldown_skipped", 4, 4) => written(&["FFFFB", "FFFBFB", "FFBFBFB", "FBFBFBFB"]),
            ("cooldown_skipped", 4, 2) => written(&["FF", "FF", "FFB", "FBFB"]),
            _ => vec![],
        }
    };
    let mistakes = [
        "gpipe_schedule",
        "warmup_one_too_many",
        "warmup_one_too_few",
        "same_warmup_everywhere",
        "no_warmup",
        "cooldown_skipped",
    ]
    .map(|id| (id, mistaken(id)));
    let mut matching = mistakes.iter().filter(|(_, schedules)| schedules == got);
    match (matching.next(), matching.next()) {
        (Some((id, _)), None) => Some(mistake(24, id)),
        _ => None,
    }
}

#[rstest]
#[case::one_stage(1, M)]
#[case::two_stages(2, M)]
#[case::three_stages(3, M)]
#[case::four_stages(4, M)]
#[case::fewer_micro_batches_than_stages(4, 2)]
fn every_stage_gets_its_gradients_of_the_mean_loss(#[case] stages: usize, #[case] m: usize) {
    expect_gradients_of_the_mean_loss(ONE_F_ONE_B, stages, m);
}

#[rstest]
fn the_last_stage_reports_the_mean_loss(#[values(1, 3)] stages: usize) {
    expect_the_mean_loss_on_the_last_stage(ONE_F_ONE_B, stages);
}

#[rstest]
#[case::two_stages(2, M)]
#[case::four_stages(4, M)]
#[case::fewer_micro_batches_than_stages(4, 2)]
fn every_stage_warms_up_then_runs_one_forward_one_backward(#[case] stages: usize, #[case] m: usize) {
    let got: Vec<Vec<StageOp>> = run(ONE_F_ONE_B, stages, m).into_iter().map(|r| r.schedule).collect();
    let want = one_f_one_b(stages, m);
    let Some(s) = (0..stages).find(|&s| got[s] != want[s]) else { return };
    panic!(
        "with {stages} stages and {m} micro-batches, stage {s} ran {:?}; 1F1B runs {:?} there. Idle share of the \
         stages, a backward as long as a forward: yours {}, 1F1B's {} = (S−1)/(M+S−1){}",
        got[s],
        want[s],
        bubble(&got),
        bubble(&want),
        cause(schedule_mistake(&got, m))
    );
}

#[rstest]
fn no_stage_holds_more_micro_batches_in_flight_than_stages_after_it(#[values(2, 4)] stages: usize) {
    let got: Vec<Vec<StageOp>> = run(ONE_F_ONE_B, stages, M).into_iter().map(|r| r.schedule).collect();
    let Some(s) = (0..stages).find(|&s| most_in_flight(&got[s]) > (stages - s).min(M)) else { return };
    panic!(
        "with {stages} stages and {M} micro-batches, stage {s} held up to {} micro-batches in flight (forward run, \
         backward not yet), each with its activations alive; 1F1B holds at most min(S−s, M) = {} on stage {s} \
         (GPipe holds all {M}){}",
        most_in_flight(&got[s]),
        (stages - s).min(M),
        cause(schedule_mistake(&got, M))
    );
}

#[rstest]
fn activations_and_their_gradients_cross_each_cut_once_per_micro_batch(#[values(2, 3)] stages: usize) {
    expect_one_send_per_micro_batch_and_cut(ONE_F_ONE_B, stages);
}

/// On GPUs a send waits for its receive: the schedule must not have two
/// neighbours send to each other, each before its receive.
#[rstest]
#[case::two_stages(2, M)]
#[case::four_stages(4, M)]
#[case::fewer_micro_batches_than_stages(4, 2)]
fn it_runs_where_a_send_waits_for_its_receive(#[case] stages: usize, #[case] m: usize) {
    expect_it_runs_where_sends_wait(ONE_F_ONE_B, stages, m, Some("sends_cross"));
}

/// Each stage a process, activations and gradients sent over TCP.
#[test]
fn it_runs_across_processes_over_tcp() {
    expect_the_same_across_processes(ONE_F_ONE_B);
}
