//! Ungraded checks of the code around the exercises: they pass on the stubs too.

use candle_core::{Device, Module, Tensor, Var};
use workbook::model::Linear;
use workbook::{param_specs, GptConfig, ParamStore, Recompute, RotaryCache};

use crate::support::{expect_close, fixture, F32};

fn tiny() -> GptConfig {
    GptConfig {
        vocab_size: 64,
        hidden_size: 32,
        num_layers: 2,
        num_heads: 4,
        num_kv_heads: None,
        intermediate_size: 48,
        max_seq_len: 12,
        rope_theta: 10_000.0,
        norm_eps: 1e-5,
        bias: false,
        tie_word_embeddings: false,
    }
}

#[test]
fn rotary_cache_matches_pytorch() {
    let f = fixture(3);
    let cache = RotaryCache::new(8, 16, 10_000.0, &Device::Cpu).unwrap();
    let (cos, sin) = cache.get(5, candle_core::DType::F32).unwrap();
    expect_close(&cos, &f.get("cos"), F32, "rotary cos table", &[]);
    expect_close(&sin, &f.get("sin"), F32, "rotary sin table", &[]);
}

#[test]
fn rotary_cache_rejects_sequences_longer_than_max_seq_len() {
    let cache = RotaryCache::new(8, 4, 10_000.0, &Device::Cpu).unwrap();
    let err = cache.get(5, candle_core::DType::F32).unwrap_err().to_string();
    assert!(err.contains("longer than the model's max_seq_len 4"), "{err}");
}

#[test]
fn parameter_names_and_shapes() {
    let listing: Vec<String> =
        param_specs(&tiny()).iter().map(|s| format!("{} {:?} {:?}", s.name, s.shape.dims(), s.kind)).collect();
    insta::assert_snapshot!(listing.join("\n"));
}

#[test]
fn config_rejects_heads_that_do_not_divide_the_width() {
    let config = GptConfig { num_heads: 5, ..tiny() };
    let err = config.validate().unwrap_err().to_string();
    assert!(err.contains("not divisible by num_heads 5"), "{err}");
}

#[test]
fn parameters_that_do_not_fit_the_config_are_rejected() {
    let mut tensors: Vec<(String, Tensor)> = param_specs(&tiny())
        .into_iter()
        .map(|s| (s.name, Tensor::zeros(s.shape, candle_core::DType::F32, &Device::Cpu).unwrap()))
        .collect();
    tensors.retain(|(name, _)| name != "lm_head.weight");
    let params = ParamStore::from_tensors(tensors).unwrap();
    let err = workbook::Gpt::new(&tiny(), &params).unwrap_err().to_string();
    assert!(err.contains("`lm_head.weight` is missing"), "{err}");
}

/// A two-layer toy network: checkpointing must reproduce plain backprop exactly.
#[test]
fn recompute_gives_the_gradients_of_plain_backprop() {
    #[derive(Clone)]
    struct TanhLinear(Linear);
    impl Module for TanhLinear {
        fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
            self.0.forward(x)?.tanh()
        }
    }
    impl workbook::autograd::Checkpointed for TanhLinear {}
    let dev = Device::Cpu;
    let w: Vec<Var> = (0..3)
        .map(|i| Var::from_tensor(&(Tensor::randn(0f32, 0.5, (6, 6), &dev).unwrap() + i as f64).unwrap()).unwrap())
        .collect();
    let embed = Var::from_tensor(&Tensor::randn(0f32, 1.0, (4, 6), &dev).unwrap()).unwrap();
    let layers: Vec<TanhLinear> = w.iter().map(|w| TanhLinear(Linear::new(w.as_tensor().clone(), None))).collect();
    let x0 = (embed.as_tensor() * 2.0).unwrap(); // a tracked, non-leaf input

    let mut y = x0.clone();
    for layer in &layers {
        y = layer.forward(&y).unwrap();
    }
    let plain = y.sqr().unwrap().sum_all().unwrap().backward().unwrap();

    let mut recompute = Recompute::default();
    let mut y = x0.clone();
    for layer in &layers {
        y = recompute.checkpoint(layer, &y).unwrap();
    }
    let mut grads = y.sqr().unwrap().sum_all().unwrap().backward().unwrap();
    recompute.backward(&mut grads).unwrap();

    assert_eq!(recompute.len(), 3);
    for (name, var) in w.iter().map(|v| ("layer weight", v)).chain([("embedding", &embed)]) {
        expect_close(grads.get(var).unwrap(), plain.get(var).unwrap(), F32, name, &[]);
    }
}

/// The optimizer itself, with groups built by hand, against `torch.optim.AdamW`.
#[test]
fn adamw_matches_pytorch() {
    use workbook::train::{AdamW, ParamGroup};

    use crate::exercise_08::{adamw_fixture, step_three_times};
    let f = fixture(8);
    let (params, config) = adamw_fixture(&f);
    let (decay, no_decay): (Vec<_>, Vec<_>) =
        params.iter().map(|(n, v)| (n.to_string(), v.rank())).partition(|(_, rank)| *rank >= 2);
    let names = |group: Vec<(String, usize)>| group.into_iter().map(|(n, _)| n).collect();
    let groups = vec![
        ParamGroup { names: names(decay), weight_decay: config.weight_decay },
        ParamGroup { names: names(no_decay), weight_decay: 0.0 },
    ];
    let mut opt = AdamW::new(groups, config.adamw).unwrap();
    step_three_times(&f, &params, &mut opt);
    for (name, var) in params.iter() {
        expect_close(var, &f.get(&format!("after.{name}")), F32, &format!("AdamW: {name}"), &[]);
    }
}

/// The trainers refuse groups that would leave a parameter untrained or train it twice.
#[test]
fn groups_must_hold_every_parameter_once() {
    use workbook::train::ParamGroup;

    let f = fixture(8);
    let (params, _) = crate::exercise_08::adamw_fixture(&f);
    let all: Vec<String> = params.iter().map(|(n, _)| n.to_string()).collect();
    let group = |names: &[String], weight_decay| ParamGroup { names: names.to_vec(), weight_decay };
    let decay = ParamGroup::decay_by_name(&[group(&all[..2], 0.1), group(&all[2..], 0.0)], &params).unwrap();
    assert_eq!((decay[&all[0]], decay[&all[5]]), (0.1, 0.0));
    let error = |groups: &[ParamGroup]| ParamGroup::decay_by_name(groups, &params).unwrap_err().to_string();
    assert!(error(&[group(&all[1..], 0.1)]).contains(&format!("`{}` is in no optimizer group", all[0])));
    assert!(error(&[group(&all, 0.1), group(&all[3..4], 0.0)])
        .contains(&format!("`{}` is in two optimizer groups", all[3])));
    let stray = [group(&all, 0.1), group(&["model.nothing".to_string()], 0.0)];
    assert!(error(&stray).contains("`model.nothing`, which is not a parameter"));
}

mod checkpoints {
    use std::collections::HashMap;

    use candle_core::{Device, Tensor};
    use workbook::train::{
        AdamWConfig, Checkpoint, CosineSchedule, LrSchedule, OptimizerConfig, TrainConfig, TrainerState,
    };

    use super::tiny;
    use crate::support::scratch_dir;

    fn checkpoint() -> Checkpoint {
        let train = TrainConfig {
            grad_accum_steps: 1,
            max_grad_norm: 1.0,
            schedule: LrSchedule::Cosine(CosineSchedule { max_lr: 1e-3, min_lr: 1e-4, warmup_steps: 1, max_steps: 10 }),
            optimizer: OptimizerConfig { weight_decay: 0.1, adamw: AdamWConfig::default() },
            activation_checkpointing: false,
        };
        let t = Tensor::new(&[1f32, 2., 3.], &Device::Cpu).unwrap();
        Checkpoint {
            params: HashMap::from([("w".to_string(), t.clone())]),
            optimizer: HashMap::from([("exp_avg.w".to_string(), t)]),
            state: TrainerState::new(3, 3, tiny(), train, None),
        }
    }

    #[test]
    fn rewriting_a_checkpoint_leaves_no_partial_directories() {
        let root = scratch_dir("ckpt-rewrite");
        let dir = root.join("step_000003");
        checkpoint().write(&dir).unwrap();
        checkpoint().write(&dir).unwrap();
        let entries: Vec<_> = std::fs::read_dir(&root).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(entries, vec![std::ffi::OsString::from("step_000003")], "only the finished checkpoint remains");
        assert_eq!(Checkpoint::read(&dir).unwrap().state.step, 3);
    }

    /// A flipped bit in a weight still parses as a tensor file; only the checksum tells.
    #[test]
    fn a_flipped_bit_in_a_weight_fails_its_checksum() {
        let dir = scratch_dir("ckpt-bit-flip").join("step_000003");
        checkpoint().write(&dir).unwrap();
        let path = dir.join("model.safetensors");
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 1; // inside the last f32 of `w`
        bytes[last] ^= 0x01;
        std::fs::write(&path, bytes).unwrap();
        let error = Checkpoint::read(&dir).unwrap_err().to_string();
        assert!(error.contains("model.safetensors is corrupt: its checksum does not match"), "{error}");
        std::fs::remove_file(dir.join("checksums.json")).unwrap();
        assert!(Checkpoint::read(&dir).is_ok(), "a checkpoint from before checksums loads unchecked");
    }

    #[test]
    fn a_corrupt_tensor_file_is_named_in_the_error() {
        let dir = scratch_dir("ckpt-corrupt").join("step_000003");
        checkpoint().write(&dir).unwrap();
        std::fs::write(dir.join("model.safetensors"), b"not a safetensors file").unwrap();
        let err = Checkpoint::read(&dir).unwrap_err().to_string();
        assert!(err.contains("model.safetensors is corrupt"), "{err}");
    }

    #[test]
    fn a_directory_without_state_is_not_a_checkpoint() {
        let dir = scratch_dir("ckpt-empty");
        let err = Checkpoint::read(&dir).unwrap_err().to_string();
        assert!(err.contains("is not a checkpoint"), "{err}");
    }
}

/// An inf in any gradient skips the whole update instead of poisoning Adam's moments.
#[test]
fn adamw_skips_a_step_with_a_non_finite_gradient() {
    use workbook::autograd::Gradients;
    use workbook::train::{AdamW, AdamWConfig, ParamGroup};
    let params = ParamStore::from_tensors([("w", Tensor::new(&[1f32, 2.], &Device::Cpu).unwrap())]).unwrap();
    let mut opt =
        AdamW::new(vec![ParamGroup { names: vec!["w".into()], weight_decay: 0.0 }], AdamWConfig::default()).unwrap();
    let mut grads = Gradients::default();
    grads.insert("w", Tensor::new(&[f32::INFINITY, 1.], &Device::Cpu).unwrap());
    opt.step(&params, &grads, 0.1).unwrap();
    assert_eq!((opt.steps(), opt.skipped_steps()), (0, 1));
    assert_eq!(params.get("w").unwrap().to_vec1::<f32>().unwrap(), vec![1., 2.], "the parameters must be untouched");
}

#[test]
fn an_io_error_keeps_its_kind_and_source_under_its_description() {
    let missing = std::path::Path::new("no/such/file.bin");
    let cause = std::fs::File::open(missing).unwrap_err();
    let expected = format!("cannot open no/such/file.bin: {cause}");
    let error = workbook::error::io_path("open", missing, cause);
    assert_eq!(error.to_string(), expected);
    let candle_core::Error::Io(io) = &error else { panic!("not an Io error: {error:?}") };
    assert_eq!(io.kind(), std::io::ErrorKind::NotFound);
    assert!(io.get_ref().and_then(|e| e.source()).is_some(), "the original io::Error is the source");
}

#[test]
fn a_tensor_parallel_block_refuses_heads_the_ranks_do_not_divide() {
    let config = tiny();
    let zeros = param_specs(&config)
        .into_iter()
        .map(|spec| (spec.name, Tensor::zeros(spec.shape, candle_core::DType::F32, &Device::Cpu).unwrap()));
    let params = ParamStore::from_tensors(zeros).unwrap();
    let refused = workbook::parallel::tensor::TensorParallelBlock::shard(&config, &params, 0, 0, 3);
    let err = refused.err().expect("4 heads cannot be split across 3 ranks; shard should refuse");
    assert!(err.to_string().contains("do not split evenly across 3 ranks"), "unexpected error: {err}");
}

/// The pipeline's stages and its bubble arithmetic.
mod pipeline {
    use candle_core::{DType, Device, Tensor};
    use workbook::parallel::pipeline::StageOp::{Backward, Forward};
    use workbook::parallel::pipeline::{bubble_fraction, stage_layers, PipelineSchedule, PipelineStage};
    use workbook::{param_specs, GptConfig, ParamStore};

    use crate::pipeline_runs::{gpipe, most_in_flight, one_f_one_b};

    fn model(num_layers: usize, tie_word_embeddings: bool) -> (GptConfig, ParamStore) {
        let config = GptConfig {
            vocab_size: 16,
            hidden_size: 8,
            num_layers,
            num_heads: 2,
            num_kv_heads: None,
            intermediate_size: 16,
            max_seq_len: 4,
            rope_theta: 10_000.0,
            norm_eps: 1e-5,
            bias: false,
            tie_word_embeddings,
        };
        let zeros = param_specs(&config)
            .into_iter()
            .map(|spec| (spec.name, Tensor::zeros(spec.shape, DType::F32, &Device::Cpu).unwrap()));
        (config.clone(), ParamStore::from_tensors(zeros).unwrap())
    }

    #[test]
    fn each_stage_holds_its_blocks_and_the_ends_hold_the_rest() {
        let (config, params) = model(3, false);
        let names = |index| -> Vec<String> {
            let stage = PipelineStage::new(&config, &params, index, 2).unwrap();
            stage.params().iter().map(|(name, _)| name.to_string()).filter(|n| !n.contains(".layers.")).collect()
        };
        assert_eq!(names(0), ["model.embed_tokens.weight"]);
        assert_eq!(names(1), ["lm_head.weight", "model.norm.weight"]);
        assert_eq!(PipelineStage::new(&config, &params, 1, 2).unwrap().layers(), 2..3);
    }

    #[test]
    fn a_pipeline_longer_than_the_model_or_with_tied_ends_is_an_error() {
        let (config, params) = model(2, false);
        let error = PipelineStage::new(&config, &params, 0, 3).err().unwrap().to_string();
        assert!(error.contains("2 layers cannot fill 3 pipeline stages"), "{error}");
        let (config, params) = model(2, true);
        let error = PipelineStage::new(&config, &params, 0, 2).err().unwrap().to_string();
        assert!(error.contains("tie_word_embeddings = false"), "{error}");
    }

    #[test]
    fn layers_split_into_even_runs_the_first_stages_taking_the_rest() {
        let split: Vec<_> = (0..3).map(|i| stage_layers(8, 3, i)).collect();
        assert_eq!(split, [0..3, 3..6, 6..8]);
        assert_eq!(stage_layers(4, 4, 3), 3..4);
    }

    #[test]
    fn gpipe_idles_s_minus_one_over_m_plus_s_minus_one() {
        for (stages, micro_batches) in [(2, 4), (4, 4), (4, 8), (3, 1)] {
            let bubble = bubble_fraction(&vec![gpipe(micro_batches); stages], 1.0, 2.0).unwrap();
            let want = (stages - 1) as f64 / (micro_batches + stages - 1) as f64;
            assert!((bubble - want).abs() < 1e-12, "S {stages}, M {micro_batches}: {bubble} vs {want}");
        }
    }

    /// Starting backwards early changes the memory, not the idle time.
    #[test]
    fn one_f_one_b_idles_as_long_as_gpipe() {
        for (stages, micro_batches) in [(2, 4), (4, 4), (4, 8), (4, 2), (3, 1)] {
            for backward in [1.0, 2.0] {
                let gpipe = bubble_fraction(&vec![gpipe(micro_batches); stages], 1.0, backward).unwrap();
                let one_f_one_b = bubble_fraction(&one_f_one_b(stages, micro_batches), 1.0, backward).unwrap();
                assert!((gpipe - one_f_one_b).abs() < 1e-12, "S {stages}, M {micro_batches}: {one_f_one_b} vs {gpipe}");
            }
        }
    }

    #[test]
    fn the_most_in_flight_is_what_each_schedule_holds() {
        let (stages, micro_batches) = (4, 6);
        for (s, ops) in one_f_one_b(stages, micro_batches).iter().enumerate() {
            let one_f_one_b = PipelineSchedule::OneFOneB.most_in_flight(s, stages, micro_batches);
            assert_eq!(one_f_one_b, most_in_flight(ops), "stage {s}");
            let gpipe_holds = PipelineSchedule::GPipe.most_in_flight(s, stages, micro_batches);
            assert_eq!(gpipe_holds, most_in_flight(&gpipe(micro_batches)), "stage {s}");
        }
    }

    #[test]
    fn one_micro_batch_at_a_time_idles_all_but_one_stage() {
        let one_by_one = [Forward, Backward].repeat(4);
        let bubble = bubble_fraction(&vec![one_by_one; 4], 1.0, 2.0).unwrap();
        assert!((bubble - 0.75).abs() < 1e-12, "{bubble}");
    }

    #[test]
    fn schedules_that_wait_on_each_other_are_an_error() {
        // Stage 0 waits for a gradient of a micro-batch it has not sent yet.
        let crossed = vec![vec![Backward, Forward], vec![Forward, Backward]];
        assert!(bubble_fraction(&crossed, 1.0, 1.0).is_err());
    }

    #[test]
    fn a_schedule_is_named_gpipe_or_1f1b() {
        assert_eq!("1f1b".parse::<PipelineSchedule>().unwrap(), PipelineSchedule::OneFOneB);
        assert_eq!("gpipe".parse::<PipelineSchedule>().unwrap(), PipelineSchedule::GPipe);
        let error = "pipedream".parse::<PipelineSchedule>().unwrap_err().to_string();
        assert!(error.contains("use gpipe or 1f1b"), "{error}");
    }
}
