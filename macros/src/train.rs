//! The training entry of a scalar-valued method: its graph is built in training mode,
//! differentiated at build time by the VJP rules of `kiln-autodiff` (reverse order,
//! gradients of reused values summed), planned with the forward pass as one program,
//! and emitted as a typed method over a hidden raw one that runs the plan, records the
//! buffer updates and assembles the `Grads` struct.

use crate::dsl::FieldKind;
use crate::graph::{Leaf, MGraph};
use crate::lower::messages::describe;
use crate::lower::{Lower, Val};
use crate::model::ModelField;
use crate::model::{Defs, MethodSig};
use kiln_autodiff::vjp;
use kiln_tensor::ir::{NodeId, NodeKind};
use kiln_tensor::nn::{join, Mode};
use kiln_tensor::{BuilderExt, DType, Precision};
use proc_macro2::TokenStream;
use quote::{format_ident, quote};
use std::collections::{HashMap, HashSet};
use syn::Ident;

/// The backward pass: appends gradient nodes for `loss`, starting from `seed` (the
/// loss scale) or else from 1, and returns, per forward node, its gradient node.
pub fn backward(
    mg: &mut MGraph,
    loss: NodeId,
    seed: Option<NodeId>,
) -> kiln_tensor::Result<HashMap<NodeId, NodeId>> {
    let dtype = mg.g.nodes[loss].meta.dtype;
    let d_loss = match seed {
        Some(scale) => mg.cast(&scale, dtype)?,
        None => mg.full(vec![], 1.0, dtype)?,
    };
    // The scale's own leaf keeps its name (the input the plan reads).
    if seed != Some(d_loss) {
        mg.name(d_loss, "d_loss");
    }
    let mut grads: HashMap<NodeId, NodeId> = HashMap::new();
    grads.insert(loss, d_loss);
    for id in (0..=loss).rev() {
        let Some(&g) = grads.get(&id) else { continue };
        let node = mg.g.nodes[id].clone();
        if let NodeKind::Call(_) = node.kind {
            // The part's own backward pass, run when the plan gets here.
            let input = node.inputs[0];
            let ig = mg.call_grad(id, g);
            let total = match grads.get(&input) {
                Some(&prev) => mg.add(&prev, &ig)?,
                None => ig,
            };
            grads.insert(input, total);
            continue;
        }
        let NodeKind::Op(op) = &node.kind else {
            continue;
        };
        let inputs: Vec<&NodeId> = node.inputs.iter().collect();
        let first = mg.g.nodes.len();
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
        // A node's gradient belongs to the layer the node does.
        if let Some(layer) = mg.layers.get(id).cloned().flatten() {
            mg.in_layer(first, &layer);
        }
    }
    Ok(grads)
}

/// Readable, distinct variable names for the values a training entry returns: a
/// node's name from the model's code (`loss`, `d_fc1_weight`), else `t<node>`.
struct Names<'a> {
    mg: &'a MGraph,
    vars: Vec<Option<Ident>>,
    used: HashSet<String>,
}

impl<'a> Names<'a> {
    fn new(mg: &'a MGraph) -> Self {
        Names {
            mg,
            vars: vec![None; mg.g.nodes.len()],
            used: HashSet::new(),
        }
    }

    /// The variable holding node `n`.
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
}

/// Generates `<name>_and_grad` for a scalar-valued method.
#[allow(clippy::too_many_arguments)]
pub fn value_and_grad(
    model: &Ident,
    fields: &[ModelField],
    methods: &[MethodSig],
    defs: &Defs,
    precision: Precision,
    m: &MethodSig,
    plan_id: usize,
    natives: &mut crate::fuse::Natives,
) -> Result<TokenStream, Vec<syn::Error>> {
    let mut lower = Lower::new(fields, methods, defs, Mode::Train { seed: 0 }, precision);
    let v = lower.lower_method(m);
    if !lower.errors.is_empty() {
        return Err(lower.errors);
    }
    let Ok(Val::T(loss)) = v else {
        return Err(vec![syn::Error::new(
            m.name().span(),
            "the loss must be a tensor",
        )]);
    };
    let mut mg = std::mem::take(&mut lower.mg);
    mg.name(loss, "loss");
    let scaled = precision.loss_scaled();
    if scaled && !mg.parts.is_empty() {
        return Err(vec![syn::Error::new(
            m.name().span(),
            format!(
                "`{}` calls a dynamic part, whose gradients the loss scaling of an {precision} instance does not reach yet: train it in f32 or bf16",
                m.name()
            ),
        )]);
    }
    // A loss-scaled step starts its backward pass from the model's loss scale (an
    // input of the plan) and divides each parameter's gradient by it again.
    let loss_scale = scaled.then(|| mg.input(format_ident!("__loss_scale"), vec![], DType::F32));
    let differentiate = |e: kiln_tensor::Error| {
        vec![syn::Error::new(
            m.name().span(),
            format!("cannot differentiate `{}`: {}", m.name(), describe(&e)),
        )]
    };
    let grads = backward(&mut mg, loss, loss_scale).map_err(differentiate)?;

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
            let g = match loss_scale {
                Some(scale) => {
                    let unscaled = mg.div(&g, &scale).map_err(differentiate)?;
                    if let Some(name) = mg.names.get(g).cloned().flatten() {
                        mg.name(unscaled, &format!("{name}_unscaled"));
                    }
                    unscaled
                }
                None => g,
            };
            outputs.push(g);
            grad_of.insert(key.clone(), g);
        }
    }
    outputs.extend(mg.updates.iter().map(|u| u.node));
    // Every part's backward pass runs, even where its input needs no gradient: it
    // gives the part's parameter gradients.
    for i in 0..mg.g.nodes.len() {
        if let NodeKind::CallGrad(k) = mg.g.nodes[i].kind {
            outputs.push(i);
            let name = format!("d_input_of_{}", mg.parts[k].key.replace('.', "_"));
            mg.name(i, &name);
        }
    }

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
    let fused = crate::fuse::fuse(&mg, &unique, plan_id, &const_name, natives, true);
    let mut names = Names::new(&mg);
    let out_vars: Vec<Ident> = unique.iter().map(|&o| names.var(o)).collect();
    let loss_var = names.var(loss);
    let updates: Vec<TokenStream> = mg
        .updates
        .iter()
        .map(|u| {
            let (layer, field) = (&u.layer, &u.field);
            let v = names.var(u.node);
            quote!(#layer.#field.update(::kiln::tensor::Tensor::from_raw(#v.clone())?)?;)
        })
        .collect();
    // Each dynamic part's gradients, summed over its calls, into its field of `Grads`.
    let mut part_grads = Vec::new();
    let mut done: Vec<&str> = Vec::new();
    for site in &mg.parts {
        if done.contains(&site.key.as_str()) {
            continue;
        }
        done.push(&site.key);
        let calls: Vec<usize> = (0..mg.parts.len())
            .filter(|&k| mg.parts[k].key == site.key)
            .collect();
        let place = site.key.split('.').map(|seg| match seg.parse::<usize>() {
            Ok(i) => {
                let i = proc_macro2::Literal::usize_unsuffixed(i);
                quote!([#i])
            }
            Err(_) => {
                let f = format_ident!("{}", seg);
                quote!(.#f)
            }
        });
        part_grads.push(quote!(grads #(#place)* = __parts.gradients(&[#(#calls),*])?;));
    }
    let grads_mut = if part_grads.is_empty() {
        quote!()
    } else {
        quote!(mut)
    };
    let mut param_grads = Vec::new();
    for f in fields {
        grads_in_order(
            &f.kind,
            &f.ident.to_string(),
            defs,
            &grad_of,
            &mut names,
            &mut param_grads,
        );
    }

    let name = m.name();
    let fname = format_ident!("{}_and_grad", name);
    let raw = crate::model::raw_name(&fname);
    let sizes = crate::model::size_args(m);
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
    let (plan_const, parts) = (&fused.plan_const, &fused.parts);
    let nexts = out_vars
        .iter()
        .map(|_| quote!(__outs.next().expect("a plan returns each of its outputs")));
    let run = fused.run(quote!(|__outs| (#(#nexts,)*)));
    let scale_input =
        scaled.then(|| quote!(let __loss_scale = &self.__kiln_loss_scale.tensor(&__dev)?;));
    Ok(quote! {
        #plan_const

        #[doc = #doc]
        pub fn #fname<#(const #consts: usize),*>(&self, #(#arg_names: &#arg_tys),*) -> ::kiln::tensor::Result<(#ret, #grads_ty<Be>)> {
            let (loss, grads) = self.#raw(#sizes, #(#arg_names.raw()),*)?;
            Ok((::kiln::tensor::Tensor::from_raw(loss)?, grads))
        }

        #[doc(hidden)]
        #[allow(clippy::too_many_arguments, clippy::redundant_clone)]
        fn #raw(&self, __sizes: &[(&str, usize)], #(#arg_names: &::kiln::tensor::RawTensor<Be>),*) -> ::kiln::tensor::Result<(::kiln::tensor::RawTensor<Be>, #grads_ty<Be>)> {
            let __dev = #device;
            let __seed = self.__kiln_seeds.next();
            #scale_input
            #parts
            let (#(#out_vars,)*) = #run;
            #(#updates)*
            let #grads_mut grads = <Self as ::kiln::tensor::nn::Module<Be>>::grads_from_raw(&mut [#(#param_grads),*].into_iter())?;
            #(#part_grads)*
            Ok((#loss_var, grads))
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
            FieldKind::Param(_) => return Some(quote!(self.#id.value.device().clone())),
            _ => {}
        }
    }
    None
}

/// The gradient of every parameter under a field, in `visit_params` order (nested
/// models through their definitions): its gradient node, or zeros when the loss does
/// not depend on it.
fn grads_in_order(
    kind: &FieldKind,
    key: &str,
    defs: &Defs,
    grad_of: &HashMap<String, NodeId>,
    names: &mut Names,
    out: &mut Vec<TokenStream>,
) {
    match kind {
        FieldKind::Layer(spec) => {
            for p in spec.params() {
                out.push(match grad_of.get(&join(key, p.name)) {
                    Some(&g) => {
                        let v = names.var(g);
                        quote!(#v.clone())
                    }
                    None => {
                        let d = &p.dims;
                        quote!(::kiln::tensor::RawTensor::<Be>::zeros(&[#(#d),*], ::kiln::tensor::DType::F32, &__dev)?)
                    }
                });
            }
        }
        FieldKind::Param(dims) => out.push(match grad_of.get(key) {
            Some(&g) => {
                let v = names.var(g);
                quote!(#v.clone())
            }
            None => quote!(::kiln::tensor::RawTensor::<Be>::zeros(&[#(#dims),*], ::kiln::tensor::DType::F32, &__dev)?),
        }),
        FieldKind::Array(inner, n) => {
            for i in 0..*n {
                grads_in_order(inner, &join(key, &i.to_string()), defs, grad_of, names, out);
            }
        }
        // Its own backward pass gives them (see `part_grads`).
        FieldKind::Dynamic(_) => {}
        FieldKind::Model(path) => {
            if let Some(def) = defs.get(&crate::dsl::model_name(path)) {
                for f in &def.fields {
                    let key = join(key, &f.ident.to_string());
                    grads_in_order(&f.kind, &key, defs, grad_of, names, out);
                }
            }
        }
    }
}
