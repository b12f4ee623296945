//! What the guide's candle primer (`guide/src/candle-primer.md`) says of
//! candle, checked against the candle the workbook builds with: one test per
//! statement, so that a newer candle that behaves otherwise fails here
//! before the page misleads anyone. Ungraded: they pass on the stubs too.

use candle_core::{bail, Context, DType, Device, Error, Result, Tensor, Var};

fn row(values: &[f32]) -> Tensor {
    Tensor::new(values, &Device::Cpu).unwrap()
}

fn values(t: &Tensor) -> Vec<f32> {
    t.to_vec1::<f32>().unwrap()
}

/// norm(x) · w + x, with norm(x) = x / sqrt(mean(x²)): x meets a tracked
/// tensor only in the addition.
fn block(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let norm = x.broadcast_div(&x.sqr()?.mean_keepdim(0)?.sqrt()?)?;
    (norm * w)? + x
}

/// ∂/∂x of sum(norm(x) · w + x), worked out by hand: for r = sqrt(mean(x²))
/// over n elements, ∂/∂x_i = w_i / r − x_i · Σ_j w_j x_j / (n r³) + 1.
fn whole_gradient(x: &[f32], w: &[f32]) -> Vec<f32> {
    let n = x.len() as f32;
    let r = (x.iter().map(|v| v * v).sum::<f32>() / n).sqrt();
    let wx: f32 = x.iter().zip(w).map(|(a, b)| a * b).sum();
    x.iter().zip(w).map(|(xi, wi)| wi / r - xi * wx / (n * r * r * r) + 1.0).collect()
}

fn close(got: &[f32], want: &[f32]) -> bool {
    got.len() == want.len() && got.iter().zip(want).all(|(g, w)| (g - w).abs() <= 1e-5 * w.abs().max(1.0))
}

const X: [f32; 3] = [1.0, -2.0, 3.0];
const W: [f32; 3] = [0.5, 1.5, -1.0];

#[test]
fn a_var_gets_its_whole_gradient() {
    let (x, w) = (Var::from_tensor(&row(&X)).unwrap(), Var::from_tensor(&row(&W)).unwrap());
    let store = block(x.as_tensor(), w.as_tensor()).unwrap().sum_all().unwrap().backward().unwrap();
    let got = values(store.get(x.as_tensor()).expect("a variable's gradient"));
    assert!(close(&got, &whole_gradient(&X, &W)), "{got:?} against {:?}", whole_gradient(&X, &W));
}

#[test]
fn a_tensor_that_is_not_a_var_gets_only_the_gradient_of_the_ops_where_it_met_a_tracked_one() {
    let (x, w) = (row(&X), Var::from_tensor(&row(&W)).unwrap());
    let store = block(&x, w.as_tensor()).unwrap().sum_all().unwrap().backward().unwrap();
    let got = values(store.get(&x).expect("the addition read x beside a tracked tensor"));
    assert_eq!(got, vec![1.0; 3], "only the addition's part: the norm recorded nothing");
    assert!(!close(&got, &whole_gradient(&X, &W)));
}

#[test]
fn from_tensor_copies_into_a_new_tensor_and_keeps_a_variable_as_it_is() {
    let x = row(&X);
    let var = Var::from_tensor(&x).unwrap();
    assert_ne!(var.as_tensor().id(), x.id());
    var.set(&row(&[0.0; 3])).unwrap();
    assert_eq!(values(&x), X, "setting the variable leaves the tensor it was made from");
    assert_eq!(Var::from_tensor(var.as_tensor()).unwrap().as_tensor().id(), var.as_tensor().id());
    assert_eq!(x.clone().id(), x.id(), "a clone is the same tensor to autograd");
}

#[test]
fn computing_with_the_tensor_a_var_was_made_from_records_nothing() {
    let x = row(&X);
    let _var = Var::from_tensor(&x).unwrap();
    assert!(!(&x * 2.0).unwrap().track_op());
}

#[test]
fn the_store_drops_intermediate_results_and_knows_nothing_of_unrelated_tensors() {
    let (x, w) = (Var::from_tensor(&row(&X)).unwrap(), Var::from_tensor(&row(&W)).unwrap());
    let h = (x.as_tensor() * w.as_tensor()).unwrap();
    let unrelated = row(&[7.0]);
    let store = h.sum_all().unwrap().backward().unwrap();
    assert!(store.get(&h).is_none(), "an intermediate result's gradient is dropped");
    assert!(store.get(&unrelated).is_none());
    let detached = x.as_tensor().detach();
    let store = (&detached * w.as_tensor()).unwrap().sum_all().unwrap().backward().unwrap();
    assert!(store.get(x.as_tensor()).is_none(), "detach cuts the graph");
}

#[test]
fn backward_of_a_non_scalar_is_that_of_its_sum_and_each_backward_gives_a_fresh_store() {
    let x = Var::from_tensor(&row(&X)).unwrap();
    let y = x.as_tensor().sqr().unwrap();
    let first = values(y.backward().unwrap().get(x.as_tensor()).unwrap());
    let second = values(y.backward().unwrap().get(x.as_tensor()).unwrap());
    assert_eq!(first, X.map(|v| 2.0 * v), "the gradient of sum(x²)");
    assert_eq!(first, second, "nothing accumulates between backwards");
}

#[test]
fn plain_ops_need_equal_shapes_and_the_broadcast_ones_align_from_the_right() {
    let (a, b) = (Tensor::ones((2, 3), DType::F32, &Device::Cpu).unwrap(), row(&X));
    let error = (&a * &b).unwrap_err().to_string();
    assert!(error.contains("shape mismatch in mul"), "{error}");
    assert_eq!(a.broadcast_mul(&b).unwrap().dims(), [2, 3]);
    let stretched = b.broadcast_as((2, 3)).unwrap();
    assert!(!stretched.is_contiguous(), "a view on the same three numbers");
    assert_eq!(b.broadcast_left(4).unwrap().dims(), [4, 3]);
    assert_eq!(values(&(1.0 + &b).unwrap()), X.map(|v| 1.0 + v));
}

#[test]
fn matmul_wants_equal_batch_dimensions_and_broadcast_matmul_broadcasts_them() {
    let x = Tensor::ones((2, 4, 3), DType::F32, &Device::Cpu).unwrap();
    let w = Tensor::ones((3, 5), DType::F32, &Device::Cpu).unwrap();
    assert!(x.matmul(&w).is_err());
    assert_eq!(x.broadcast_matmul(&w).unwrap().dims(), [2, 4, 5]);
}

#[test]
fn dtypes_never_mix_and_reading_values_wants_the_exact_dtype() {
    let a = row(&X);
    let b = a.to_dtype(DType::BF16).unwrap();
    assert!((&a * &b).is_err());
    assert!(b.to_vec1::<f32>().is_err());
    assert!(b.sum_all().unwrap().to_scalar::<f32>().is_err());
    assert_eq!(b.to_dtype(DType::F32).unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap(), 2.0);
}

#[test]
fn where_cond_takes_an_integer_condition_and_three_tensors_of_one_shape() {
    let values = row(&X);
    let fill = Tensor::full(-9f32, 3, &Device::Cpu).unwrap();
    let keep = row(&[1.0, 0.0, 1.0]).to_dtype(DType::U8).unwrap();
    let picked = keep.where_cond(&values, &fill).unwrap();
    assert_eq!(picked.to_vec1::<f32>().unwrap(), [1.0, -9.0, 3.0], "on_true where non-zero");
    assert!(keep.where_cond(&values, &row(&[-9.0])).is_err(), "nothing broadcasts");
    assert!(row(&[1.0, 0.0, 1.0]).where_cond(&values, &fill).is_err(), "an f32 condition");
    assert_eq!(values.lt(0f32).unwrap().dtype(), DType::U8);
    assert_eq!(Tensor::tril2(3, DType::U8, &Device::Cpu).unwrap().dtype(), DType::U8);
}

#[test]
fn where_conds_gradient_goes_to_the_branch_it_picked() {
    let (on_true, on_false) = (Var::from_tensor(&row(&X)).unwrap(), Var::from_tensor(&row(&W)).unwrap());
    let keep = row(&[1.0, 0.0, 1.0]).to_dtype(DType::U8).unwrap();
    let picked = keep.where_cond(on_true.as_tensor(), on_false.as_tensor()).unwrap();
    let store = picked.sum_all().unwrap().backward().unwrap();
    assert_eq!(values(store.get(on_true.as_tensor()).unwrap()), [1.0, 0.0, 1.0]);
    assert_eq!(values(store.get(on_false.as_tensor()).unwrap()), [0.0, 1.0, 0.0]);
}

#[test]
fn bail_and_question_marks_in_a_closure_return_from_the_closure() {
    let checked = |x: f32| -> Result<f32> {
        if x < 0.0 {
            bail!("{x} is negative")
        }
        Ok(x)
    };
    let all: Result<Vec<f32>> = X.iter().map(|&x| checked(x)).collect();
    assert!(all.unwrap_err().to_string().contains("-2 is negative"), "collect stops at the first error");
    let kept: Vec<f32> = X.iter().filter_map(|&x| checked(x).ok()).collect();
    assert_eq!(kept, [1.0, 3.0], "the enclosing code goes on");
}

#[test]
fn an_option_becomes_an_error_with_context_or_ok_or_else() {
    let missing: Option<f32> = None;
    // With backtraces on, candle adds one to the message: its start is the message.
    let error = missing.context("no gradient for the input").unwrap_err().to_string();
    assert!(error.starts_with("no gradient for the input"), "{error}");
    let error = missing.ok_or_else(|| Error::Msg("no gradient".into())).unwrap_err();
    assert_eq!(error.to_string(), "no gradient");
}
