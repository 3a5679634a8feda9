//! Helpers shared by the model tests: checking a model's build-time gradients against
//! central finite differences of its loss.

use kiln::cpu::Cpu;
use kiln::prelude::*;
use kiln::tensor::nn::Module;
use kiln::tensor::RawTensor;
use std::collections::HashMap;

/// Moves element `index` of the parameter `name` by `delta`, through
/// `update_params` (the path optimizers take; `grads` is only passed along).
fn nudge<M: Module<Cpu>>(model: &mut M, grads: &M::Grads, name: &str, index: usize, delta: f32) {
    let mut f = |n: &str, p: &mut RawTensor<Cpu>, _g: &RawTensor<Cpu>| -> Result<()> {
        if n == name {
            let mut v = p.to_vec::<f32>()?;
            v[index] += delta;
            *p = RawTensor::from_vec(v, p.dims().as_slice(), p.device())?;
        }
        Ok(())
    };
    model.update_params(grads, "", &mut f).unwrap();
}

/// Asserts that `grads` (of `loss` at `model`) agree with central differences of
/// step 1e-2 at each `(parameter, element)`, to 5e-5 + 2%, and that each difference
/// is larger than `min` (a vanishing gradient would pass vacuously).
pub fn check_finite_differences<M: Module<Cpu>>(
    model: &mut M,
    grads: &M::Grads,
    at: &[(&str, usize)],
    min: f32,
    loss: impl Fn(&M) -> f32,
) {
    let mut analytic = HashMap::new();
    // Read before any nudge: a dynamic part finds its gradients by the tensors its
    // last forward pass read.
    model
        .update_params(grads, "", &mut |n, _p, g| {
            analytic.insert(n.to_string(), g.to_vec::<f32>()?);
            Ok(())
        })
        .unwrap();
    let eps = 1e-2;
    for &(name, index) in at {
        let mut loss_at = |delta: f32| {
            nudge(model, grads, name, index, delta);
            let l = loss(model);
            nudge(model, grads, name, index, -delta);
            l
        };
        let numeric = (loss_at(eps) - loss_at(-eps)) / (2.0 * eps);
        let got = analytic[name][index];
        assert!(
            numeric.abs() > min && (got - numeric).abs() <= 5e-5 + 0.02 * numeric.abs(),
            "{name}[{index}]: build-time gradient {got}, finite difference {numeric}"
        );
    }
}
