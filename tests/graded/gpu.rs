//! The single-GPU checks (a build with `--features cuda`, on a machine with an
//! NVIDIA GPU; `cargo xtask check-phase` runs them when `doctor` finds one).
//! Your model and train step computed on GPU 0 must give PyTorch's numbers,
//! as they do on the CPU: the same fixtures as exercises 7 and 10, moved to
//! the GPU. With `--features nccl`, a one-rank NCCL group must hand back what
//! it is given (NCCL refuses two ranks on one GPU, so a single GPU can show no
//! more of it). The fused softmax and cross-entropy on the GPU
//! and the one-node linear layer, head reshapes, SiLU and channel scale (the
//! default, or candle's ops with `WORKBOOK_CUDA_KERNELS=composed`) must
//! compute what candle's composed ops compute on the CPU, the softmax and
//! cross-entropy at attention's and GPT-2's vocabulary's widths; in bf16
//! they must compute what the CPU's kernels do.

use candle_core::{DType, Device, Tensor, D};
use workbook::parallel::ddp::Ddp;
use workbook::train::Trainer;
use workbook::{kernels, param_specs, Gpt, ParamStore};

use crate::exercise_10::{micro_batch, model_config, train_config};
use crate::kernels::{expect_same_bits, randn};
use crate::support::{expect_close, expect_update_close, fixture, grad, ok, surrogate, var, Fixture, Tol, BF16, F32};

/// cuBLAS sums in another order than the CPU's kernels; float32 throughout.
const LOGITS: Tol = Tol { atol: 1e-4, rtol: 1e-4 };
const GRADS: Tol = Tol { atol: 1e-5, rtol: 1e-3 };
/// Relative L2 error of a parameter's update over two steps, as exercise 10 allows.
const UPDATE: f64 = 1e-3;

/// CUDA device 0, or `None`, with the reason printed, where CUDA shows no
/// GPU: the check is skipped, not failed. A GPU that fails to open fails it.
fn gpu() -> Option<Device> {
    use candle_core::cuda_backend::cudarc::driver::CudaContext;
    if CudaContext::device_count().unwrap_or(0) < 1 {
        eprintln!("skipped: this check needs a CUDA device, and CUDA shows none (see CUDA_VISIBLE_DEVICES)");
        return None;
    }
    match workbook::gpu::open(0) {
        Ok(device) => Some(device),
        Err(e) => panic!("these checks need CUDA device 0, and opening it failed: {e}"),
    }
}

/// The fixture's parameters of `names`, on `device`.
fn params_on(f: &Fixture, names: impl Iterator<Item = (String, String)>, device: &Device) -> ParamStore {
    let tensors = names.map(|(name, key)| (name, f.get(&key).to_device(device).unwrap()));
    ParamStore::from_tensors(tensors).unwrap()
}

fn on_cpu(t: &Tensor) -> Tensor {
    t.to_device(&Device::Cpu).unwrap()
}

#[test]
fn the_model_on_the_gpu_gives_pytorchs_logits_loss_and_gradients() {
    let Some(device) = gpu() else { return };
    let f = fixture(7);
    let config = f.model_config();
    let params = params_on(&f, param_specs(&config).into_iter().map(|s| (s.name.clone(), s.name)), &device);
    let gpt = ok(Gpt::new(&config, &params), "Gpt::new on the GPU");
    let (idx, labels) = (f.get("idx").to_device(&device).unwrap(), f.get("labels").to_device(&device).unwrap());
    let pass = ok(gpt.forward(&idx, Some(&labels)), "Gpt::forward on the GPU");
    assert!(pass.logits.device().is_cuda(), "the logits were computed on {:?}, not on the GPU", pass.logits.device());
    expect_close(&on_cpu(&pass.logits), &f.get("logits"), LOGITS, "logits on the GPU", &[]);
    let loss = pass.loss.as_ref().expect("forward with labels returns a loss");
    let loss = loss.to_dtype(DType::F64).unwrap().flatten_all().unwrap().to_vec1::<f64>().unwrap()[0];
    assert!((loss - f.scalar("loss")).abs() <= 1e-4, "the loss on the GPU is {loss}, PyTorch's {}", f.scalar("loss"));
    let grads = ok(pass.backward(), "ForwardPass::backward on the GPU");
    for (name, var) in params.iter() {
        let Some(g) = grads.get(var) else { panic!("no gradient reached {name} on the GPU") };
        expect_close(
            &on_cpu(g),
            &f.get(&format!("grad.{name}")),
            GRADS,
            &format!("gradient of {name} on the GPU"),
            &[],
        );
    }
}

#[test]
fn two_train_steps_on_the_gpu_match_pytorch() {
    let Some(device) = gpu() else { return };
    let f = fixture(10);
    let names = param_specs(&model_config(&f)).into_iter().map(|s| (s.name.clone(), format!("param.{}", s.name)));
    let params = params_on(&f, names, &device);
    let mut trainer = ok(Trainer::new(&model_config(&f), params, train_config(&f), Ddp::single()), "Trainer::new");
    let k = train_config(&f).grad_accum_steps;
    let losses = f.get("loss").to_vec1::<f64>().unwrap();
    for (s, want) in losses.iter().enumerate().take(2) {
        let batches: Vec<Tensor> = (0..k).map(|j| micro_batch(&f, s, j).to_device(&device).unwrap()).collect();
        let stats = ok(trainer.train_step(&batches), "Trainer::train_step on the GPU");
        assert!(
            (stats.loss - want).abs() <= 1e-4 * want.abs(),
            "step {s}: loss {} on the GPU, PyTorch's {want}",
            stats.loss
        );
    }
    for (name, var) in trainer.params.iter() {
        assert!(var.device().is_cuda(), "`{name}` left the GPU during the step: it is on {:?}", var.device());
        let before = f.get(&format!("param.{name}"));
        let want = f.get(&format!("after.{name}"));
        expect_update_close(&before, &on_cpu(var), &want, UPDATE, &format!("`{name}` after two steps on the GPU"));
    }
}

/// `f` of `x` and its gradient under the surrogate loss Σ f(x) ⊙ dy, on the CPU.
fn value_and_gradient(x: &Tensor, dy: &Tensor, f: impl Fn(&Tensor) -> Tensor) -> (Tensor, Tensor) {
    let x = var(x);
    let y = f(&x);
    let grads = surrogate(&y, dy).backward().unwrap();
    (on_cpu(&y), on_cpu(&grad(&grads, &x, "x", "the op lost its backward pass on the GPU")))
}

#[test]
fn the_attention_softmax_on_the_gpu_matches_candles_on_the_cpu() {
    let Some(device) = gpu() else { return };
    // 300 keys: rows that no thread block size divides.
    let (t, scale) = (300, 0.125);
    let scores = randn(&[2, 3, t, t], 3.0);
    let dy = randn(scores.dims(), 1.0);
    let allowed = Tensor::tril2(t, DType::U8, &Device::Cpu).unwrap();
    let composed = |x: &Tensor| {
        let blocked = Tensor::full(f32::NEG_INFINITY, x.dims(), x.device()).unwrap();
        let masked = allowed.broadcast_as(x.dims()).unwrap().where_cond(&(x * scale).unwrap(), &blocked).unwrap();
        candle_nn::ops::softmax(&masked, D::Minus1).unwrap()
    };
    let (want, want_grad) = value_and_gradient(&scores, &dy, composed);
    let allowed_gpu = allowed.to_device(&device).unwrap();
    let (got, got_grad) =
        value_and_gradient(&scores.to_device(&device).unwrap(), &dy.to_device(&device).unwrap(), |x| {
            kernels::scaled_masked_softmax(x, &allowed_gpu, scale).unwrap()
        });
    expect_close(&got, &want, F32, "kernels::scaled_masked_softmax on the GPU", &[]);
    expect_close(&got_grad, &want_grad, F32, "the gradient of kernels::scaled_masked_softmax on the GPU", &[]);

    let rows = randn(&[7, 1000], 3.0);
    let dy = randn(rows.dims(), 1.0);
    let (want, want_grad) = value_and_gradient(&rows, &dy, |x| candle_nn::ops::softmax(x, D::Minus1).unwrap());
    let (got, got_grad) = value_and_gradient(&rows.to_device(&device).unwrap(), &dy.to_device(&device).unwrap(), |x| {
        kernels::softmax(x).unwrap()
    });
    expect_close(&got, &want, F32, "kernels::softmax on the GPU", &[]);
    expect_close(&got_grad, &want_grad, F32, "the gradient of kernels::softmax on the GPU", &[]);
}

#[test]
fn the_cross_entropy_on_the_gpu_matches_candles_on_the_cpu_at_gpt2s_vocabulary() {
    let Some(device) = gpu() else { return };
    let (n, v) = (19, 50_257);
    let logits = randn(&[n, v], 3.0);
    let targets = Tensor::from_vec((0..n as u32).map(|i| (i * 7919) % v as u32).collect(), n, &Device::Cpu).unwrap();
    // A loss scaled by 3, so that the backward pass must use the incoming gradient.
    let three = Tensor::new(3f32, &Device::Cpu).unwrap();
    let (want, want_grad) =
        value_and_gradient(&logits, &three, |x| candle_nn::loss::cross_entropy(x, &targets).unwrap());
    let targets_gpu = targets.to_device(&device).unwrap();
    let (got, got_grad) =
        value_and_gradient(&logits.to_device(&device).unwrap(), &three.to_device(&device).unwrap(), |x| {
            kernels::cross_entropy(x, &targets_gpu).unwrap()
        });
    expect_close(&got, &want, F32, "kernels::cross_entropy on the GPU", &[]);
    expect_close(&got_grad, &want_grad, F32, "the gradient of kernels::cross_entropy on the GPU", &[]);
}

/// The cases the CPU's cross-entropy settles, settled the same way on the
/// GPU: -inf logits ahead of finite ones in a row (a thread's running max
/// starts at -inf) add nothing, and a target that is no class index is
/// refused with the CPU's message, not turned into a NaN loss.
#[test]
fn the_cross_entropy_on_the_gpu_treats_minus_infinity_and_bad_targets_as_the_cpu_does() {
    let Some(device) = gpu() else { return };
    let (n, v) = (3, 3000); // more classes than a block's 1024 threads
    let blocked = Tensor::full(f32::NEG_INFINITY, (n, 64), &Device::Cpu).unwrap();
    let logits = Tensor::cat(&[&blocked, &randn(&[n, v - 64], 3.0)], 1).unwrap();
    let targets = Tensor::new(&[100u32, 2000, 2999], &Device::Cpu).unwrap();
    let want = kernels::cross_entropy(&logits, &targets).unwrap();
    let got = kernels::cross_entropy(&logits.to_device(&device).unwrap(), &targets.to_device(&device).unwrap());
    expect_close(&on_cpu(&got.unwrap()), &want, F32, "kernels::cross_entropy on the GPU with -inf logits", &[]);
    let beyond = Tensor::new(&[100u32, 3000, 5], &device).unwrap();
    let cpu_error = kernels::cross_entropy(&logits, &beyond.to_device(&Device::Cpu).unwrap()).unwrap_err();
    let gpu_error = kernels::cross_entropy(&logits.to_device(&device).unwrap(), &beyond).unwrap_err();
    assert_eq!(gpu_error.to_string(), cpu_error.to_string(), "a target beyond the classes, on the GPU");
}

/// In bf16 the fused softmax and cross-entropy read and write bf16 and
/// compute in f32, on the GPU as on the CPU: the same function, each output
/// rounded once, so the two agree to a bf16 rounding or two.
#[test]
fn the_bf16_softmax_and_cross_entropy_on_the_gpu_match_the_cpus_kernels() {
    let Some(device) = gpu() else { return };
    let bf16 = |t: Tensor| t.to_dtype(DType::BF16).unwrap();
    let t = 300;
    let (scores, dy) = (bf16(randn(&[2, 3, t, t], 3.0)), bf16(randn(&[2, 3, t, t], 1.0)));
    let allowed = Tensor::tril2(t, DType::U8, &Device::Cpu).unwrap();
    let (want, want_grad) =
        value_and_gradient(&scores, &dy, |x| kernels::scaled_masked_softmax(x, &allowed, 0.125).unwrap());
    let allowed_gpu = allowed.to_device(&device).unwrap();
    let (got, got_grad) =
        value_and_gradient(&scores.to_device(&device).unwrap(), &dy.to_device(&device).unwrap(), |x| {
            kernels::scaled_masked_softmax(x, &allowed_gpu, 0.125).unwrap()
        });
    assert_eq!(got.dtype(), DType::BF16, "kernels::scaled_masked_softmax on the GPU changed the dtype");
    expect_close(&got, &want, BF16, "bf16 kernels::scaled_masked_softmax on the GPU", &[]);
    expect_close(&got_grad, &want_grad, BF16, "the gradient of bf16 kernels::scaled_masked_softmax on the GPU", &[]);

    let (n, v) = (19, 50_257);
    let logits = bf16(randn(&[n, v], 3.0));
    let targets = Tensor::from_vec((0..n as u32).map(|i| (i * 7919) % v as u32).collect(), n, &Device::Cpu).unwrap();
    let three = bf16(Tensor::new(3f32, &Device::Cpu).unwrap());
    let (want, want_grad) = value_and_gradient(&logits, &three, |x| kernels::cross_entropy(x, &targets).unwrap());
    let targets_gpu = targets.to_device(&device).unwrap();
    let (got, got_grad) =
        value_and_gradient(&logits.to_device(&device).unwrap(), &three.to_device(&device).unwrap(), |x| {
            kernels::cross_entropy(x, &targets_gpu).unwrap()
        });
    assert_eq!(got.dtype(), DType::BF16, "kernels::cross_entropy on the GPU changed the dtype");
    expect_close(&got, &want, BF16, "bf16 kernels::cross_entropy on the GPU", &[]);
    expect_close(&got_grad, &want_grad, BF16, "the gradient of bf16 kernels::cross_entropy on the GPU", &[]);
}

/// Random values of `shape`, drawn apart from `randn(shape, ..)`'s.
fn randn_other(shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    randn(&[n + 1], 1.0).narrow(0, 0, n).unwrap().reshape(shape).unwrap()
}

/// `f` of `a` and `b` and both gradients under the surrogate loss Σ f(a, b) ⊙ dy, on the CPU.
fn values_and_gradients(a: &Tensor, b: &Tensor, dy: &Tensor, f: impl Fn(&Tensor, &Tensor) -> Tensor) -> [Tensor; 3] {
    let (a, b) = (var(a), var(b));
    let y = f(&a, &b);
    let grads = surrogate(&y, dy).backward().unwrap();
    let lost = "the op lost its backward pass on the GPU";
    [on_cpu(&y), on_cpu(&grad(&grads, &a, "a", lost)), on_cpu(&grad(&grads, &b, "b", lost))]
}

#[test]
fn the_one_node_linear_heads_silu_and_channel_scale_on_the_gpu_match_candles_ops_on_the_cpu() {
    let Some(device) = gpu() else { return };
    let gpu = |t: &Tensor| t.to_device(&device).unwrap();
    let (x, w, dy) = (randn(&[3, 5, 64], 1.0), randn(&[96, 64], 0.1), randn_other(&[3, 5, 96]));
    let want = values_and_gradients(&x, &w, &dy, |x, w| x.broadcast_matmul(&w.t().unwrap()).unwrap());
    let got = values_and_gradients(&gpu(&x), &gpu(&w), &gpu(&dy), |x, w| kernels::linear(x, w).unwrap());
    for (what, got, want) in labelled(["kernels::linear", "its input's gradient", "its weight's gradient"], got, want) {
        expect_close(&got, &want, LOGITS, &format!("{what} on the GPU"), &[]);
    }
    // bf16 operands, as autocast gives them: cuBLAS against the CPU's f32 product of the same values.
    let bf16 = |t: &Tensor| t.to_dtype(DType::BF16).unwrap();
    let y = kernels::linear(&gpu(&bf16(&x)), &gpu(&bf16(&w))).unwrap();
    let want =
        bf16(&x).to_dtype(DType::F32).unwrap().broadcast_matmul(&bf16(&w).to_dtype(DType::F32).unwrap().t().unwrap());
    expect_close(
        &on_cpu(&y.to_dtype(DType::F32).unwrap()),
        &want.unwrap(),
        BF16,
        "kernels::linear of bf16 on the GPU",
        &[],
    );

    let x = randn(&[2, 7, 48], 1.0);
    let split_dy = randn_other(&[2, 3, 7, 16]);
    let (want, want_grad) = value_and_gradient(&x, &split_dy, |x| {
        x.reshape((2, 7, 3, 16)).unwrap().transpose(1, 2).unwrap().contiguous().unwrap()
    });
    let (got, got_grad) = value_and_gradient(&gpu(&x), &gpu(&split_dy), |x| kernels::split_heads(x, 3).unwrap());
    expect_close(&got, &want, F32, "kernels::split_heads on the GPU", &[]);
    expect_close(&got_grad, &want_grad, F32, "the gradient of kernels::split_heads on the GPU", &[]);
    let (want, want_grad) =
        value_and_gradient(&split_dy, &x, |y| y.transpose(1, 2).unwrap().reshape((2, 7, 48)).unwrap());
    let (got, got_grad) = value_and_gradient(&gpu(&split_dy), &gpu(&x), |y| kernels::merge_heads(y).unwrap());
    expect_close(&got, &want, F32, "kernels::merge_heads on the GPU", &[]);
    expect_close(&got_grad, &want_grad, F32, "the gradient of kernels::merge_heads on the GPU", &[]);

    // SiLU over more elements than one launch's threads cover at once.
    let (x, dy) = (randn(&[3, 700, 129], 3.0), randn_other(&[3, 700, 129]));
    let (want, want_grad) = value_and_gradient(&x, &dy, |x| candle_nn::ops::silu(x).unwrap());
    let (got, got_grad) = value_and_gradient(&gpu(&x), &gpu(&dy), |x| kernels::silu(x).unwrap());
    expect_close(&got, &want, F32, "kernels::silu on the GPU", &[]);
    expect_close(&got_grad, &want_grad, F32, "the gradient of kernels::silu on the GPU", &[]);

    let (x, weight, dy) = (randn(&[4, 9, 48], 1.0), randn(&[48], 1.0), randn_other(&[4, 9, 48]));
    let want = values_and_gradients(&x, &weight, &dy, |x, w| x.broadcast_mul(w).unwrap());
    let got = values_and_gradients(&gpu(&x), &gpu(&weight), &gpu(&dy), |x, w| kernels::scale_channels(x, w).unwrap());
    let names = ["kernels::scale_channels", "its input's gradient", "its weight's gradient"];
    for (what, got, want) in labelled(names, got, want) {
        expect_close(&got, &want, F32, &format!("{what} on the GPU"), &[]);
    }
}

#[test]
fn the_optimizers_passes_on_the_gpu_match_the_cpus() {
    let Some(device) = gpu() else { return };
    let gpu = |t: &Tensor| t.to_device(&device).unwrap();
    let n = 3 * 1024 + 77; // whole rows of the GPU's sums and a remainder
    let (decayed, grad, m) = (randn(&[n], 1.0), randn_other(&[n]), randn(&[n, 1], 0.1).flatten_all().unwrap());
    let v = randn_other(&[n, 1]).flatten_all().unwrap().abs().unwrap();
    let step =
        kernels::AdamWStep { lr: 6e-4, beta1: 0.9, beta2: 0.95, eps: 1e-8, correction1: 0.271, correction2: 0.142 };
    let (p, m_new, v_new) = kernels::adamw_update(&decayed, &grad, &m, &v, step).unwrap();
    let (gp, gm, gv) = kernels::adamw_update(&gpu(&decayed), &gpu(&grad), &gpu(&m), &gpu(&v), step).unwrap();
    // The kernel is compiled without fused multiply-adds and does the CPU's
    // f32 operations in the CPU's order: the same bits, not just close.
    for (what, got, want) in labelled(["the parameter", "m", "v"], [gp, gm, gv], [p, m_new, v_new]) {
        assert!(got.device().is_cuda(), "kernels::adamw_update left the GPU for {what}");
        expect_same_bits(&on_cpu(&got), &want, &format!("kernels::adamw_update's {what} on the GPU"), "the CPU's");
    }

    let tensors = [randn(&[n], 1.0), randn(&[40, 768], 0.5), randn(&[7], 2.0)];
    let want = kernels::sum_of_squares(&tensors.iter().collect::<Vec<_>>()).unwrap();
    let on_gpu: Vec<Tensor> = tensors.iter().map(gpu).collect();
    let got = kernels::sum_of_squares(&on_gpu.iter().collect::<Vec<_>>()).unwrap();
    assert!((got - want).abs() <= 1e-5 * want, "kernels::sum_of_squares on the GPU is {got}, on the CPU {want}");
    assert!(
        kernels::all_finite(&on_gpu.iter().collect::<Vec<_>>()).unwrap(),
        "all_finite on the GPU found a non-finite value"
    );
    let with_nan = gpu(&Tensor::from_vec(vec![1f32, f32::NAN, 2.0], 3, &Device::Cpu).unwrap());
    let listed = [&on_gpu[0], &with_nan, &on_gpu[1]];
    assert!(
        !kernels::all_finite(&listed).unwrap(),
        "all_finite on the GPU missed a NaN in the second of three tensors"
    );
}

/// Each name with the results it labels, the GPU's and the CPU's.
fn labelled<const N: usize>(
    names: [&str; N],
    got: [Tensor; N],
    want: [Tensor; N],
) -> impl Iterator<Item = (&str, Tensor, Tensor)> {
    names.into_iter().zip(got).zip(want).map(|((name, got), want)| (name, got, want))
}

/// A group of one rank over NCCL on GPU 0, or `None` where there is none.
#[cfg(feature = "nccl")]
fn one_rank_nccl_group() -> Option<workbook::distributed::NcclProcessGroup> {
    use std::time::Duration;
    use workbook::distributed::{launch::free_port, NcclProcessGroup, Rendezvous};

    let device = gpu()?;
    let port = free_port("127.0.0.1").unwrap();
    let rv = Rendezvous {
        rank: 0,
        world_size: 1,
        master: format!("127.0.0.1:{port}"),
        token: "gpu-check".into(),
        timeout: Duration::from_secs(30),
    };
    Some(ok(NcclProcessGroup::init(&rv, device.as_cuda_device().unwrap()), "NcclProcessGroup::init"))
}

#[cfg(feature = "nccl")]
#[test]
fn a_one_rank_nccl_group_hands_back_what_it_is_given() {
    use workbook::distributed::{Collective, ProcessGroup, ReduceOp};

    let Some(pg) = one_rank_nccl_group() else { return };
    let t = Tensor::arange(0f32, 6.0, &pg.device()).unwrap().reshape((3, 2)).unwrap();
    let want = on_cpu(&t);
    let results = [
        ("all_reduce(Sum)", pg.all_reduce(&t, ReduceOp::Sum)),
        ("all_reduce(Avg)", pg.all_reduce(&t, ReduceOp::Avg)),
        ("broadcast", pg.broadcast(&t, 0)),
        ("all_gather", pg.all_gather(&t)),
        ("reduce_scatter", pg.reduce_scatter(&t, ReduceOp::Sum)),
        ("all_reduce of bf16", pg.all_reduce(&t.to_dtype(DType::BF16).unwrap(), ReduceOp::Sum)),
    ];
    for (call, result) in results {
        let got = ok(result, call);
        assert!(got.device().is_cuda(), "{call}: the result is on {:?}, not on the GPU", got.device());
        let got = on_cpu(&got.to_dtype(DType::F32).unwrap());
        assert_eq!(got.dims(), want.dims(), "{call}: shape");
        let diff = (got - &want).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
        assert!(diff == 0.0, "{call} on one rank must return its input, differs by {diff}");
    }
    ok(pg.barrier(), "barrier");
    let stats = pg.stats();
    assert_eq!(stats.calls(Collective::AllReduce), 3, "every all-reduce counted");
    assert_eq!(stats.calls(Collective::Barrier), 1, "the barrier counted");
}

/// NCCL's calls run on a stream of their own. An `_async` call must still
/// read its input only after the kernels that wrote it, keep that input
/// until it is done even when the caller drops it at once (the compute
/// stream's next allocations would otherwise reuse its memory while NCCL
/// reads it), and hand back its result only once the compute stream has
/// waited for it. Each input here comes from a chain of elementwise kernels
/// long enough to be still running when the call is queued, and the same
/// chain, run again afterwards, gives the bits each result must have.
#[cfg(feature = "nccl")]
#[test]
fn nccl_calls_on_their_own_stream_wait_for_their_input_and_keep_it() {
    use workbook::distributed::{ProcessGroup, ReduceOp};

    let Some(pg) = one_rank_nccl_group() else { return };
    assert!(pg.properties().overlaps, "the NCCL group's _async calls should overlap with compute");
    let device = pg.device();
    let produce = |start: f32| {
        let mut x = Tensor::full(start, 1 << 24, &device).unwrap();
        for _ in 0..30 {
            x = x.affine(1.0001, 0.5).unwrap().sqrt().unwrap();
        }
        x
    };
    // Each input's only handle is dropped as the call returns.
    let reduced = ok(pg.all_reduce_async(&produce(3.0), ReduceOp::Sum), "all_reduce_async");
    let gathered = ok(pg.all_gather_async(&produce(5.0)), "all_gather_async");
    // Work that allocates while the calls may still run.
    let busy = produce(7.0);
    let blocking = ok(pg.all_reduce(&produce(11.0), ReduceOp::Sum), "all_reduce");
    let results = [
        ("all_reduce_async", ok(reduced.wait(), "waiting for all_reduce_async"), produce(3.0)),
        ("all_gather_async", ok(gathered.wait(), "waiting for all_gather_async"), produce(5.0)),
        ("all_reduce", blocking, produce(11.0)),
        ("the compute in between", busy, produce(7.0)),
    ];
    for (what, got, want) in results {
        expect_same_bits(&on_cpu(&got), &on_cpu(&want), &format!("{what} on one rank"), "its input, recomputed");
    }
}
