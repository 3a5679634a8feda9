//! The training entry of a scalar-valued method: its graph is built in training mode,
//! differentiated at build time by the VJP rules of `kiln-autodiff` (reverse order,
//! gradients of reused values summed), and emitted as straight-line Rust over
//! `RawTensor` — forward, backward, buffer updates, and the `Grads` struct.

use crate::dsl::{dtype_path, layer_type, FieldKind};
use crate::graph::{Leaf, MGraph};
use crate::lower::{describe, Lower, MethodSig, Val};
use crate::structs::ModelField;
use crate::sym::{f64_tokens, DimTokens, SDim};
use kiln_autodiff::vjp;
use kiln_tensor::ir::{KeptGuard, NodeId, NodeKind};
use kiln_tensor::nn::{join, Mode};
use kiln_tensor::{BuilderExt, Guard, Op, RandDist, Window2d};
use proc_macro2::TokenStream;
use quote::{format_ident, quote};
use std::collections::{HashMap, HashSet};
use syn::Ident;

/// The backward pass: appends gradient nodes for `loss` and returns, per forward node,
/// its gradient node.
pub fn backward(mg: &mut MGraph, loss: NodeId) -> kiln_tensor::Result<HashMap<NodeId, NodeId>> {
    let dtype = mg.g.nodes[loss].meta.dtype;
    let one = mg.full(vec![], 1.0, dtype)?;
    mg.name(one, "d_loss");
    let mut grads: HashMap<NodeId, NodeId> = HashMap::new();
    grads.insert(loss, one);
    for id in (0..=loss).rev() {
        let Some(&g) = grads.get(&id) else { continue };
        let node = mg.g.nodes[id].clone();
        let NodeKind::Op(op) = &node.kind else {
            continue;
        };
        let inputs: Vec<&NodeId> = node.inputs.iter().collect();
        let input_grads = vjp(mg, op, &inputs, &id, &g)?;
        for (&input, ig) in node.inputs.iter().zip(input_grads) {
            let Some(ig) = ig else { continue };
            let total = match grads.get(&input) {
                Some(&prev) => mg.add(&prev, &ig)?,
                None => ig,
            };
            if let Some(name) = mg.names[input].clone() {
                mg.name(total, &format!("d_{name}"));
            }
            grads.insert(input, total);
        }
    }
    Ok(grads)
}

/// Emits straight-line code for the live nodes that `outputs` need.
pub struct Emitter<'a> {
    mg: &'a MGraph,
    vars: Vec<Option<Ident>>,
    used: HashSet<String>,
}

impl<'a> Emitter<'a> {
    /// An emitter over a finished graph.
    pub fn new(mg: &'a MGraph) -> Self {
        Emitter {
            mg,
            vars: vec![None; mg.g.nodes.len()],
            used: HashSet::new(),
        }
    }

    fn var(&mut self, n: NodeId) -> Ident {
        if let Some(v) = &self.vars[n] {
            return v.clone();
        }
        let base: String = match &self.mg.names[n] {
            Some(s) => s
                .chars()
                .map(|c| {
                    if c.is_alphanumeric() || c == '_' {
                        c
                    } else {
                        '_'
                    }
                })
                .collect(),
            None => format!("t{n}"),
        };
        let mut name = base.clone();
        let mut k = 2;
        while !self.used.insert(name.clone()) {
            name = format!("{base}_{k}");
            k += 1;
        }
        let id = format_ident!("{}", name);
        self.vars[n] = Some(id.clone());
        id
    }

    fn dim(&mut self, d: &SDim) -> TokenStream {
        let origins: Vec<(u32, NodeId, usize)> = d
            .runtime_atoms()
            .into_iter()
            .map(|a| {
                let (n, ax) = self.mg.origin[&a];
                (a, n, ax)
            })
            .collect();
        let mut exprs = HashMap::new();
        for (a, n, ax) in origins {
            let v = self.var(n);
            exprs.insert(a, quote!(#v.dims()[#ax]));
        }
        d.to_expr(&|a| exprs[&a].clone())
    }

    fn dims(&mut self, ds: &[SDim]) -> TokenStream {
        let d: Vec<TokenStream> = ds.iter().map(|d| self.dim(d)).collect();
        quote!(&[#(#d),*])
    }

    /// The nodes `outputs` need, including where run-time sizes are read.
    pub fn live(&self, outputs: &[NodeId]) -> Vec<bool> {
        let mut outs: Vec<NodeId> = outputs.to_vec();
        loop {
            let live = self.mg.g.live(&outs);
            let mut more = Vec::new();
            for (i, n) in self.mg.g.nodes.iter().enumerate() {
                if !live[i] {
                    continue;
                }
                let mut atoms = Vec::new();
                match &n.kind {
                    NodeKind::Op(op) => op_dims(op)
                        .iter()
                        .for_each(|d| atoms.extend(d.runtime_atoms())),
                    NodeKind::RecipDim(d) => atoms.extend(d.runtime_atoms()),
                    NodeKind::Leaf(_) => {}
                }
                for a in atoms {
                    let (o, _) = self.mg.origin[&a];
                    if !live[o] && !more.contains(&o) {
                        more.push(o);
                    }
                }
            }
            if more.is_empty() {
                return live;
            }
            outs.extend(more);
        }
    }

    /// `let` statements for every live node, in order.
    pub fn emit(&mut self, live: &[bool]) -> Vec<TokenStream> {
        let mut out = Vec::new();
        let n = self.mg.g.nodes.len();
        for (i, node) in self.mg.g.nodes.iter().enumerate() {
            out.extend(self.guards_at(i, live));
            if !live[i] {
                continue;
            }
            let v = self.var(i);
            let dtype = dtype_path(node.meta.dtype);
            let expr = match &node.kind {
                NodeKind::Leaf(k) => match &self.mg.leaves[*k] {
                    Leaf::Input(name) => quote!(#name.raw().clone()),
                    Leaf::Param { layer, field, .. } => quote!(#layer.#field.raw().clone()),
                    Leaf::Buffer { layer, field, .. } => quote!(#layer.#field.get().into_raw()),
                },
                NodeKind::RecipDim(d) => {
                    let e = self.dim(d);
                    quote!(::kiln::tensor::RawTensor::<Be>::full(&[], 1.0 / (#e as f64), #dtype, &__dev)?)
                }
                NodeKind::Op(op) => {
                    let ins: Vec<Ident> = node.inputs.iter().map(|&j| self.var(j)).collect();
                    self.op_expr(op, &ins, &dtype)
                }
            };
            out.push(quote!(let #v = #expr;));
        }
        out.extend(self.guards_at(n, live));
        out
    }

    /// The checks of the guards that run before node `at` (see `KeptGuard`) on live
    /// values: what the composites check eagerly, which the primitives here do not.
    fn guards_at(&mut self, at: NodeId, live: &[bool]) -> Vec<TokenStream> {
        let kept: Vec<&KeptGuard> = self
            .mg
            .g
            .guards
            .iter()
            .filter(|k| k.at == at && k.inputs.iter().all(|&j| live[j]))
            .collect();
        kept.into_iter()
            .map(|k| {
                let guard = match &k.guard {
                    Guard::LayerInput(spec) => {
                        let ty = layer_type(spec);
                        quote!(::kiln::tensor::Guard::LayerInput(<#ty>::spec()))
                    }
                    Guard::CrossEntropy => quote!(::kiln::tensor::Guard::CrossEntropy),
                    Guard::BatchNormTraining => quote!(::kiln::tensor::Guard::BatchNormTraining),
                    Guard::Conv2d { groups } => {
                        quote!(::kiln::tensor::Guard::Conv2d { groups: #groups })
                    }
                };
                let vars: Vec<Ident> = k
                    .inputs
                    .iter()
                    .map(|&j| {
                        self.vars[j]
                            .clone()
                            .expect("live values are emitted before their guards")
                    })
                    .collect();
                quote!(#guard.check(&[#(&#vars.meta()),*])?;)
            })
            .collect()
    }

    fn op_expr(&mut self, op: &Op<SDim>, ins: &[Ident], dtype: &TokenStream) -> TokenStream {
        let a = ins.first();
        let b = ins.get(1);
        let rt = quote!(::kiln::tensor::RawTensor::<Be>);
        match op {
            Op::Unary(u) => {
                let m = format_ident!("{}", u.method());
                quote!(#a.#m()?)
            }
            Op::Binary(bo) => {
                let m = format_ident!("{}", bo.method());
                quote!(#a.#m(&#b)?)
            }
            Op::Compare(c) => {
                let v = format_ident!("{}", format!("{c:?}"));
                quote!(#a.compare(::kiln::tensor::CmpOp::#v, &#b)?)
            }
            Op::Where => {
                let c = &ins[2];
                quote!(#a.select(&#b, &#c)?)
            }
            Op::Reduce { op, axes } => {
                let v = format_ident!("{}", format!("{op:?}"));
                quote!(#a.apply(::kiln::tensor::Op::Reduce { op: ::kiln::tensor::ReduceOp::#v, axes: vec![#(#axes),*] }, &[])?)
            }
            Op::Reshape { dims } => {
                let d = self.dims(dims);
                quote!(#a.reshape(#d)?)
            }
            Op::Permute { perm } => quote!(#a.permute(&[#(#perm),*])?),
            Op::Expand { dims } => {
                let d = self.dims(dims);
                quote!(#a.broadcast_to(#d)?)
            }
            Op::Slice {
                axis,
                start,
                end,
                step,
            } => quote!(#a.slice(#axis, #start, #end, #step)?),
            Op::Concat { axis } => quote!(#rt::concat(&[#(&#ins),*], #axis)?),
            Op::Pad {
                axis,
                before,
                after,
                value,
            } => {
                let v = f64_tokens(*value);
                quote!(#a.pad(#axis, #before, #after, #v)?)
            }
            Op::MatMul => quote!(#a.matmul(&#b)?),
            Op::Gather { axis } => quote!(#a.gather(#axis, &#b)?),
            Op::ScatterAdd { axis, dims } => {
                let d = self.dims(dims);
                quote!(#b.scatter_add(#d, #axis, &#a)?)
            }
            Op::Cast { dtype } => {
                let d = dtype_path(*dtype);
                quote!(#a.cast(#d)?)
            }
            Op::Unfold2d(w) => {
                let w = window(w);
                quote!(#a.apply(::kiln::tensor::Op::Unfold2d(#w), &[])?)
            }
            Op::Fold2d {
                window: w,
                height,
                width,
            } => {
                let w = window(w);
                let (h, wd) = (self.dim(height), self.dim(width));
                quote!(#a.apply(::kiln::tensor::Op::Fold2d { window: #w, height: #h, width: #wd }, &[])?)
            }
            Op::Full { dims, value, .. } => {
                let d = self.dims(dims);
                let v = f64_tokens(*value);
                quote!(#rt::full(#d, #v, #dtype, &__dev)?)
            }
            Op::Rand {
                dims, dist, seed, ..
            } => {
                let d = self.dims(dims);
                let dist = match dist {
                    RandDist::Uniform { low, high } => {
                        let (l, h) = (f64_tokens(*low), f64_tokens(*high));
                        quote!(::kiln::tensor::RandDist::Uniform { low: #l, high: #h })
                    }
                    RandDist::Normal { mean, std } => {
                        let (m, s) = (f64_tokens(*mean), f64_tokens(*std));
                        quote!(::kiln::tensor::RandDist::Normal { mean: #m, std: #s })
                    }
                };
                // The graph's seed is the dropout layer's ordinal; the step seed varies per call.
                quote!(#rt::rand(#d, #dist, __seed ^ #seed, #dtype, &__dev)?)
            }
        }
    }
}

fn window(w: &Window2d) -> TokenStream {
    let (k, s, p, d) = (w.kernel, w.stride, w.padding, w.dilation);
    let [k0, k1, s0, s1, p0, p1, d0, d1] = [k[0], k[1], s[0], s[1], p[0], p[1], d[0], d[1]];
    quote!(::kiln::tensor::Window2d { kernel: [#k0, #k1], stride: [#s0, #s1], padding: [#p0, #p1], dilation: [#d0, #d1] })
}

/// The dims an op carries as parameters (their run-time sizes must be readable).
fn op_dims(op: &Op<SDim>) -> Vec<SDim> {
    match op {
        Op::Reshape { dims }
        | Op::Expand { dims }
        | Op::ScatterAdd { dims, .. }
        | Op::Full { dims, .. }
        | Op::Rand { dims, .. } => dims.clone(),
        Op::Fold2d { height, width, .. } => vec![height.clone(), width.clone()],
        _ => vec![],
    }
}

/// Generates `<name>_and_grad` for a scalar-valued method.
pub fn value_and_grad(
    model: &Ident,
    fields: &[ModelField],
    methods: &[MethodSig],
    m: &MethodSig,
    plan_id: usize,
    natives: &mut crate::fuse::Natives,
) -> Result<TokenStream, Vec<syn::Error>> {
    let mut lower = Lower::new(fields, methods, Mode::Train { seed: 0 }, false);
    let v = lower.lower_method(m);
    if !lower.errors.is_empty() {
        return Err(lower.errors);
    }
    let Ok(Val::T(loss, _)) = v else {
        return Err(vec![syn::Error::new(
            m.name().span(),
            "the loss must be a tensor",
        )]);
    };
    let mut mg = std::mem::take(&mut lower.mg);
    mg.name(loss, "loss");
    let grads = backward(&mut mg, loss).map_err(|e| {
        vec![syn::Error::new(
            m.name().span(),
            format!("cannot differentiate `{}`: {}", m.name(), describe(&e)),
        )]
    })?;

    // Which leaf node holds each parameter, by checkpoint name.
    let mut param_node: HashMap<String, NodeId> = HashMap::new();
    for (i, n) in mg.g.nodes.iter().enumerate() {
        if let NodeKind::Leaf(k) = n.kind {
            if let Leaf::Param { key, .. } = &mg.leaves[k] {
                param_node.insert(key.clone(), i);
            }
        }
    }
    let mut outputs = vec![loss];
    let mut grad_of: HashMap<String, NodeId> = HashMap::new();
    // Sorted, so that the plan (and its snapshot) is the same on every build.
    let mut params: Vec<(&String, &NodeId)> = param_node.iter().collect();
    params.sort();
    for (key, &n) in params {
        if let Some(&g) = grads.get(&n) {
            outputs.push(g);
            grad_of.insert(key.clone(), g);
        }
    }
    outputs.extend(mg.updates.iter().map(|u| u.node));

    outputs.dedup();
    let mut unique: Vec<NodeId> = Vec::new();
    for &o in &outputs {
        if !unique.contains(&o) {
            unique.push(o);
        }
    }
    let const_name = format_ident!(
        "__KILN_PLAN_{}_AND_GRAD",
        m.name().to_string().to_uppercase()
    );
    let fused = crate::fuse::fuse(&mg, &unique, plan_id, &const_name, &m.consts, natives);
    let mut em = Emitter::new(&mg);
    let live = em.live(&unique);
    let body = em.emit(&live);
    let out_vars: Vec<Ident> = unique.iter().map(|&o| em.var(o)).collect();
    let loss_var = em.var(loss);
    let updates: Vec<TokenStream> = mg
        .updates
        .iter()
        .map(|u| {
            let (layer, field) = (&u.layer, &u.field);
            let v = em.var(u.node);
            quote!(#layer.#field.set(::kiln::tensor::Tensor::from_raw(#v.clone())?);)
        })
        .collect();
    let grad_fields: Vec<TokenStream> = fields
        .iter()
        .map(|f| {
            let id = &f.ident;
            let value = grads_value(&f.kind, &id.to_string(), &grad_of, &mut em);
            quote!(#id: #value)
        })
        .collect();

    let name = m.name();
    let fname = format_ident!("{}_and_grad", name);
    let consts = &m.consts;
    let arg_names: Vec<&Ident> = m.args.iter().map(|(n, _)| n).collect();
    let arg_tys: Vec<TokenStream> = m.args.iter().map(|(_, t)| t.real_type()).collect();
    let grads_ty = format_ident!("{}Grads", model);
    let ret = m.ret[0].real_type();
    let device = match arg_names.first() {
        Some(a) => quote!(#a.device().clone()),
        None => first_param_device(fields)
            .unwrap_or_else(|| quote!(::core::default::Default::default())),
    };
    let doc = format!(
        "The value of [`Self::{name}`] and the gradient of every parameter, computed by the backward pass `#[model]` derived at build time (training mode: dropout active, batch statistics used and recorded)."
    );
    let plan_const = &fused.plan_const;
    let fused_run = &fused.run;
    Ok(quote! {
        #plan_const

        #[doc = #doc]
        #[allow(unused_variables, clippy::let_and_return, clippy::redundant_clone)]
        pub fn #fname<#(const #consts: usize),*>(&self, #(#arg_names: &#arg_tys),*) -> ::kiln::tensor::Result<(#ret, #grads_ty<Be>)> {
            let __dev = #device;
            let __seed = self.__kiln_step_seed();
            let __planned = if self.__kiln_plans.fused() {
                #fused_run
            } else {
                ::core::option::Option::None
            };
            let (#(#out_vars,)*) = match __planned {
                ::core::option::Option::Some(__outs) => __outs,
                ::core::option::Option::None => {
                    #(#body)*
                    (#(#out_vars,)*)
                }
            };
            #(#updates)*
            let grads = #grads_ty { #(#grad_fields,)* __kiln_backend: ::core::marker::PhantomData };
            Ok((::kiln::tensor::Tensor::from_raw(#loss_var)?, grads))
        }
    })
}

pub(crate) fn first_param_device(fields: &[ModelField]) -> Option<TokenStream> {
    for f in fields {
        let id = &f.ident;
        match &f.kind {
            FieldKind::Layer(spec) if !spec.params().is_empty() => {
                let p = format_ident!("{}", spec.params()[0].name);
                return Some(quote!(self.#id.#p.device().clone()));
            }
            _ => {}
        }
    }
    None
}

/// The gradients value of one field: each parameter's gradient node, or zeros.
fn grads_value(
    kind: &FieldKind,
    key: &str,
    grad_of: &HashMap<String, NodeId>,
    em: &mut Emitter,
) -> TokenStream {
    match kind {
        FieldKind::Layer(spec) => {
            let ty = layer_type(spec);
            let parts: Vec<TokenStream> = spec
                .params()
                .iter()
                .map(|p| match grad_of.get(&join(key, p.name)) {
                    Some(&g) => {
                        let v = em.var(g);
                        quote!(#v.clone())
                    }
                    None => {
                        let d = &p.dims;
                        quote!(::kiln::tensor::RawTensor::<Be>::zeros(&[#(#d),*], ::kiln::tensor::DType::F32, &__dev)?)
                    }
                })
                .collect();
            quote!(<<#ty as ::kiln::tensor::nn::Module<Be>>::Grads>::from_raw([#(#parts),*])?)
        }
        FieldKind::Array(inner, n) => {
            let items: Vec<TokenStream> = (0..*n)
                .map(|i| grads_value(inner, &join(key, &i.to_string()), grad_of, em))
                .collect();
            quote!([#(#items),*])
        }
    }
}
