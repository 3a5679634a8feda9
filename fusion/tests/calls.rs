//! Calls out of a plan (`NodeKind::Call` / `CallGrad`, what a `#[model]`'s dynamic part
//! becomes): the planner makes each a kernel of its own with the elementwise work
//! around it still fused; the fused and the op-by-op paths call the parts alike and
//! give equal values; a part's result of another shape or dtype than declared is one
//! error, the same on both paths; a plan text whose calls are wired wrongly, or whose
//! one-pass kernel names ops one pass does not compute, is an error, never a panic. A
//! planned run hands its outputs to an output watcher as they are computed (not those
//! of plans run inside its parts).

use kiln_cpu::{Cpu, CpuDevice};
use kiln_fusion::{plan, KernelKind, Parts, Plan, Program, RunContext, SDim};
use kiln_tensor::ir::{Graph, NodeId};
use kiln_tensor::{BuilderExt, CmpOp, DType, RawTensor, Result, SymDim};

/// A part that scales its input by `scale` (its gradient likewise), or returns
/// `width` columns when set (a wrong shape).
struct Scale {
    scale: f32,
    width: Option<usize>,
}

impl Parts<Cpu> for Scale {
    fn name(&self, part: usize) -> String {
        format!("self.scale{part}")
    }

    fn forward(&mut self, _part: usize, input: RawTensor<Cpu>) -> Result<RawTensor<Cpu>> {
        match self.width {
            Some(w) => RawTensor::zeros(&[input.dims()[0], w], DType::F32, &CpuDevice),
            None => input.mul_scalar(self.scale as f64),
        }
    }

    fn backward(&mut self, _part: usize, grad: RawTensor<Cpu>) -> Result<RawTensor<Cpu>> {
        grad.mul_scalar(self.scale as f64)
    }
}

/// `relu(call(x + 1)) * 2` and the gradient of its sum with respect to `x`, for `x`
/// of dims `[B, 3]` (`B` a size parameter): outputs `[y, dx]`.
fn graph() -> Result<(Graph<SDim>, Vec<NodeId>, Vec<NodeId>)> {
    let mut g = Graph::<SDim>::new();
    let b = SDim::param("B");
    let x = g.leaf(0, vec![b.clone(), SDim::lit(3)], DType::F32);
    let h = g.add_scalar(&x, 1.0)?;
    let c = g.call(0, h, vec![b.clone(), SDim::lit(3)], DType::F32);
    let r = g.relu(&c)?;
    let y = g.mul_scalar(&r, 2.0)?;
    // d(sum y)/dc = 2·[c > 0]; the part's backward gives d/dh; d/dx = d/dh.
    let zero = g.scalar_like(&c, 0.0)?;
    let mask = g.compare(CmpOp::Gt, &c, &zero)?;
    let mask = g.cast(&mask, DType::F32)?;
    let dc = g.mul_scalar(&mask, 2.0)?;
    let dx = g.call_grad(c, dc);
    Ok((g, vec![x], vec![y, dx]))
}

fn run(
    program: &mut Program<Cpu>,
    fused: bool,
    x: &RawTensor<Cpu>,
    parts: &mut Scale,
) -> Result<Vec<Vec<f32>>> {
    let params = [("B", x.dims()[0])];
    let mut cx = RunContext::new(&CpuDevice).sizes(&params).parts(parts);
    let outs: Vec<RawTensor<Cpu>> = if fused {
        program
            .run(&mut cx, &[x])?
            .expect("the plan describes these inputs")
            .collect()
    } else {
        program.run_op_by_op(&mut cx, &[x])?
    };
    outs.iter().map(|t| t.to_vec::<f32>()).collect()
}

#[test]
fn calls_are_kernels_of_their_own_and_both_paths_agree() -> Result<()> {
    let (g, inputs, outputs) = graph()?;
    let p = plan(&g, &inputs, &outputs);
    let calls = p
        .kernels
        .iter()
        .filter(|k| k.kind == KernelKind::Call)
        .count();
    assert_eq!(calls, 2, "the call and its gradient");
    // Through the text form, as `#[model]` embeds plans.
    let mut program = Program::<Cpu>::new(Plan::parse(&p.to_text())?, &[]);
    let xs: Vec<f32> = vec![-3.0, -1.5, -0.5, 0.0, 0.5, 2.0];
    let x = RawTensor::<Cpu>::from_vec(xs.clone(), &[2, 3], &CpuDevice)?;
    let mut parts = Scale {
        scale: 0.5,
        width: None,
    };
    let fused = run(&mut program, true, &x, &mut parts)?;
    let eager = run(&mut program, false, &x, &mut parts)?;
    assert_eq!(fused, eager);
    let want_y: Vec<f32> = xs
        .iter()
        .map(|v| ((v + 1.0) * 0.5).max(0.0) * 2.0)
        .collect();
    let want_dx: Vec<f32> = xs
        .iter()
        .map(|v| {
            if (v + 1.0) * 0.5 > 0.0 {
                2.0 * 0.5
            } else {
                0.0
            }
        })
        .collect();
    assert_eq!(fused, vec![want_y, want_dx]);
    Ok(())
}

#[test]
fn a_part_returning_another_shape_is_one_error_on_both_paths() -> Result<()> {
    let (g, inputs, outputs) = graph()?;
    let mut program = Program::<Cpu>::new(plan(&g, &inputs, &outputs), &[]);
    let x = RawTensor::<Cpu>::from_vec(vec![1.0f32; 6], &[2, 3], &CpuDevice)?;
    let mut parts = Scale {
        scale: 1.0,
        width: Some(4),
    };
    let fused = run(&mut program, true, &x, &mut parts).expect_err("refused");
    let eager = run(&mut program, false, &x, &mut parts).expect_err("refused");
    assert_eq!(fused.to_string(), eager.to_string());
    assert_eq!(
        fused.to_string(),
        "shape mismatch in `call`: `self.scale0` returned f32 [2, 4], but the call declares f32 [2, 3] ([B, 3])"
    );
    Ok(())
}

#[test]
fn calls_wired_wrongly_in_a_plan_text_are_errors() -> Result<()> {
    let (g, inputs, outputs) = graph()?;
    let text = plan(&g, &inputs, &outputs).to_text();
    let x = RawTensor::<Cpu>::from_vec(vec![1.0f32; 6], &[2, 3], &CpuDevice)?;
    // A node line's input list, replaced.
    let rewire = |kind: &str, inputs: &str| -> String {
        let line = text
            .lines()
            .find(|l| l.contains(kind))
            .unwrap_or_else(|| panic!("no `{kind}` node in {text}"));
        let at = line.find(" in=").expect("an input list") + 4;
        let end = at + line[at..].find(' ').expect("fields after the list");
        text.replace(line, &format!("{}{inputs}{}", &line[..at], &line[end..]))
    };
    // The call with no input; the gradient without the call it is the gradient of.
    let grad_line = text.lines().find(|l| l.contains(" call_grad 0 ")).unwrap();
    // Input lists read `[11;3]`: keep the gradient, drop the call.
    let grad_input = {
        let at = grad_line.find(" in=[").unwrap() + 5;
        format!("[{}]", grad_line[at..].split([';', ']']).next().unwrap())
    };
    for broken in [
        rewire(" call 0 ", "[]"),
        rewire(" call_grad 0 ", &grad_input),
    ] {
        assert_ne!(broken, text, "the plan was rewired");
        // It parses (the text is well formed) and is refused when it runs, on both
        // paths: never a panic, never values.
        let p = Plan::parse(&broken)?;
        let mut program = Program::<Cpu>::new(p, &[]);
        let mut parts = Scale {
            scale: 1.0,
            width: None,
        };
        for fused in [true, false] {
            let e = run(&mut program, fused, &x, &mut parts).expect_err("refused");
            assert!(e.to_string().contains("call"), "{e}");
        }
    }
    Ok(())
}

/// A part that runs a plan of its own (`x · 0.5`), as a model's dynamic part does.
struct Inner(Program<Cpu>);

impl Parts<Cpu> for Inner {
    fn name(&self, part: usize) -> String {
        format!("self.inner{part}")
    }

    fn forward(&mut self, _part: usize, input: RawTensor<Cpu>) -> Result<RawTensor<Cpu>> {
        let params = [("B", input.dims()[0])];
        let outs = self
            .0
            .run(&mut RunContext::new(&CpuDevice).sizes(&params), &[&input])?;
        Ok(outs
            .expect("the inner plan describes its input")
            .next()
            .unwrap())
    }

    fn backward(&mut self, _part: usize, grad: RawTensor<Cpu>) -> Result<RawTensor<Cpu>> {
        grad.mul_scalar(0.5)
    }
}

#[test]
fn a_watcher_is_handed_each_output_planned_and_op_by_op_not_a_parts_outputs() -> Result<()> {
    use kiln_tensor::collective::watch_outputs;
    use std::{cell::RefCell, rc::Rc};
    let (g, inputs, outputs) = graph()?;
    let outer = plan(&g, &inputs, &outputs);
    let text = outer.to_text();
    let mut program = Program::<Cpu>::new(outer, &[]);
    let mut inner = Graph::<SDim>::new();
    let x = inner.leaf(0, vec![SDim::param("B"), SDim::lit(3)], DType::F32);
    let half = inner.mul_scalar(&x, 0.5)?;
    let mut parts = Inner(Program::new(plan(&inner, &[x], &[half]), &[]));
    let x = RawTensor::<Cpu>::from_vec(
        vec![-3.0f32, -1.5, -0.5, 0.0, 0.5, 2.0],
        &[2, 3],
        &CpuDevice,
    )?;
    let params = [("B", 2)];
    let values = |t: &dyn std::any::Any| {
        let t = t.downcast_ref::<RawTensor<Cpu>>().expect("a CPU tensor");
        t.to_vec::<f32>().unwrap()
    };
    let sorted = |mut v: Vec<Vec<f32>>| {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v
    };
    // Through the run context: the outer plan's two outputs, once each, with the values
    // it returns; not the inner plan's (run inside the part, in a context of its own).
    for fused in [true, false] {
        let mut handed: Vec<Vec<f32>> = Vec::new();
        let mut watch = |t: &dyn std::any::Any| handed.push(values(t));
        let mut cx = RunContext::new(&CpuDevice)
            .sizes(&params)
            .parts(&mut parts)
            .watch(Some(&mut watch));
        let outs: Vec<Vec<f32>> = match fused {
            true => program.run(&mut cx, &[&x])?.expect("planned").collect(),
            false => program.run_op_by_op(&mut cx, &[&x])?,
        }
        .iter()
        .map(|t| t.to_vec::<f32>().unwrap())
        .collect();
        assert_eq!(sorted(handed), sorted(outs), "fused: {fused}");
    }
    // Through a model's programs and the scoped watcher (what a data-parallel step
    // sets around its backward pass): the same outputs on both paths.
    let programs = kiln_fusion::Programs::<Cpu>::default();
    for fused in [true, false] {
        programs.set_fused(fused);
        let handed = Rc::new(RefCell::new(Vec::new()));
        let record = handed.clone();
        let watch = move |t: &dyn std::any::Any| record.borrow_mut().push(values(t));
        let outs = watch_outputs(Box::new(watch), || {
            let seed = kiln_tensor::nn::StepSeed::Host(0);
            let cx = RunContext::step(&CpuDevice, &params, &seed).parts(&mut parts);
            programs.call(0, &text, &[], cx, &[&x], |outs| {
                outs.map(|t| t.to_vec::<f32>().unwrap()).collect::<Vec<_>>()
            })
        })?;
        assert_eq!(sorted(handed.take()), sorted(outs), "fused: {fused}");
    }
    Ok(())
}

/// A plan text whose one-pass kernel names ops that one pass does not compute together
/// (here an attention's statistics before the attention) is one error when it runs,
/// on the planned path, not a wrong value.
#[test]
fn a_one_pass_kernel_of_other_ops_in_a_plan_text_is_an_error() -> Result<()> {
    use kiln_tensor::{AttentionSpec, Builder, Op};
    let mut g = Graph::<SDim>::new();
    let dims = || vec![SDim::lit(2), SDim::lit(5), SDim::lit(4)];
    let (q, k, v) = (
        g.leaf(0, dims(), DType::F32),
        g.leaf(1, dims(), DType::F32),
        g.leaf(2, dims(), DType::F32),
    );
    let spec = AttentionSpec::new(0.5, true);
    let out = g.apply(Op::Attention(spec), &[&q, &k, &v])?;
    let lse = g.apply(Op::AttentionLse(spec), &[&q, &k])?;
    let p = plan(&g, &[q, k, v], &[out, lse]);
    let text = p.to_text();
    let pass = text
        .lines()
        .find(|l| l.starts_with("kernel one_pass"))
        .expect("the attention and its statistics are one pass")
        .to_string();
    let (a, b) = (out, lse);
    let swapped = pass
        .replace(&format!("nodes=[{a};{b}]"), &format!("nodes=[{b};{a}]"))
        .replace(&format!("out=[{a};{b}]"), &format!("out=[{b};{a}]"));
    assert_ne!(swapped, pass);
    let mut program = Program::<Cpu>::new(Plan::parse(&text.replace(&pass, &swapped))?, &[]);
    let x = RawTensor::<Cpu>::from_vec(
        (0..40).map(|i| i as f32 * 0.1).collect(),
        &[2, 5, 4],
        &CpuDevice,
    )?;
    let err = match program.run(&mut RunContext::new(&CpuDevice), &[&x, &x, &x]) {
        Ok(_) => panic!("the swapped pass ran"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("as one pass, which they are not"), "{err}");
    Ok(())
}
