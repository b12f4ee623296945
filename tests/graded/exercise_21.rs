//! Exercise 21: a pipelined step on GPipe's schedule, graded against one
//! process (see `pipeline_runs.rs`); here, the order GPipe runs things in.

use rstest::rstest;
use workbook::parallel::pipeline::StageOp;
use workbook::phase4_under_the_hood::gpipe_step;

use crate::pipeline_runs::{
    bubble, expect_gradients_of_the_mean_loss, expect_it_runs_where_sends_wait,
    expect_one_send_per_micro_batch_and_cut, expect_the_mean_loss_on_the_last_stage, expect_the_same_across_processes,
    gpipe, run, Schedule, M,
};
use crate::support::{cause, mistake};

const GPIPE: Schedule = Schedule {
    exercise: 21,
    name: "gpipe_step",
    step: gpipe_step,
    loss_summed: "loss_summed",
    loss_overwritten: "loss_overwritten",
    backward_from_one: "backward_from_one",
    gradients_not_accumulated: "gradients_not_accumulated",
    zero_share: "zero_share",
    input_not_a_var: Some("input_not_a_var"),
};

#[rstest]
fn every_stage_gets_its_gradients_of_the_mean_loss(#[values(1, 2, 3, 4)] stages: usize) {
    expect_gradients_of_the_mean_loss(GPIPE, stages, M);
}

#[rstest]
fn the_last_stage_reports_the_mean_loss(#[values(1, 3)] stages: usize) {
    expect_the_mean_loss_on_the_last_stage(GPIPE, stages);
}

#[rstest]
fn every_stage_runs_all_forwards_then_all_backwards(#[values(2, 4)] stages: usize) {
    let schedules: Vec<Vec<StageOp>> = run(GPIPE, stages, M).into_iter().map(|r| r.schedule).collect();
    let gpipe = gpipe(M);
    let Some(s) = schedules.iter().position(|schedule| *schedule != gpipe) else { return };
    let one_by_one = schedules[s] == [StageOp::Forward, StageOp::Backward].repeat(M);
    panic!(
        "with {stages} stages and {M} micro-batches, stage {s} ran {:?}; GPipe runs the {M} forwards, then the {M} \
         backwards. Idle share of the stages, a backward as long as a forward: yours {}, GPipe's {} = (S−1)/(M+S−1){}",
        schedules[s],
        bubble(&schedules),
        bubble(&vec![gpipe; stages]),
        cause(one_by_one.then(|| mistake(21, "one_micro_batch_at_a_time")))
    );
}

#[rstest]
fn activations_and_their_gradients_cross_each_cut_once_per_micro_batch(#[values(2, 3)] stages: usize) {
    expect_one_send_per_micro_batch_and_cut(GPIPE, stages);
}

/// Each stage a process, activations and gradients sent over TCP.
/// On GPUs a send waits for its receive; GPipe's forwards all flow one way,
/// then its backwards the other, so no two stages wait for each other.
#[rstest]
fn it_runs_where_a_send_waits_for_its_receive(#[values(2, 4)] stages: usize) {
    expect_it_runs_where_sends_wait(GPIPE, stages, M, None);
}

#[test]
fn it_runs_across_processes_over_tcp() {
    expect_the_same_across_processes(GPIPE);
}
