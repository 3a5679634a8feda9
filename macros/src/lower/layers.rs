//! Calls of a model's own layers (each built from its `LayerSpec`, so the macro and the
//! runtime layers share one rule), of dynamic parts, and the embedding's `positions`
//! and `attend`.

use super::messages::{describe, describe_inner, refusal, src};
use super::{spec_params, Call, LResult, LayerRef, Lower, Val};
use crate::dsl::FieldKind;
use kiln_tensor::ir::NodeId;
use kiln_tensor::nn::{LayerSpec, Mode};
use kiln_tensor::op::fmt_dims;
use kiln_tensor::{BuilderExt, DType, Error, Guard, SymDim, TensorMeta};
use quote::{format_ident, ToTokens};
use syn::{Expr, Type};

impl<'a> Lower<'a> {
    pub(super) fn call_layer_args(
        &mut self,
        l: &LayerRef,
        args: &[&Expr],
        span: &dyn ToTokens,
    ) -> LResult<Val> {
        if args.len() != 1 {
            self.err(
                span,
                format!("`{}` takes one input, got {}", l.display, args.len()),
            );
            return Err(());
        }
        let x = self.lower_expr(args[0])?;
        self.call_layer(l, x, args[0], span)
    }

    /// Applies a layer to a value.
    pub(super) fn call_layer(
        &mut self,
        l: &LayerRef,
        x: Val,
        arg: &Expr,
        span: &dyn ToTokens,
    ) -> LResult<Val> {
        let spec = match &l.kind {
            FieldKind::Layer(s) => s.clone(),
            FieldKind::Model(_) => return self.call_model(l, "forward", &[(x, arg)], span),
            FieldKind::Dynamic(_) => {
                self.err(
                    span,
                    format!(
                        "`{0}` is a dynamic part, whose output shape the macro cannot know: declare it at the call, `{0}.forward::<B, 64>({1})` (its dims, then an optional dtype)",
                        l.display,
                        src(arg)
                    ),
                );
                return Err(());
            }
            FieldKind::Param(_) => {
                self.err(
                    span,
                    format!(
                        "`{0}` is a learned tensor, not a layer: use it as a value, like `{1} + {0}`",
                        l.display,
                        src(arg)
                    ),
                );
                return Err(());
            }
            FieldKind::Array(_, n) => {
                self.err(
                    span,
                    format!(
                        "`{}` is an array of {n} layers; call one (`{}[0]`) or loop over them",
                        l.display, l.display
                    ),
                );
                return Err(());
            }
        };
        let Val::T(xn) = x else {
            if !matches!(x, Val::Unknown) {
                self.err(&arg, format!("`{}` takes a tensor", l.display));
            }
            return Err(());
        };
        let dims = self.dims(xn);
        let meta = TensorMeta::new(dims.clone(), self.dtype(xn));
        if let Err(e) = Guard::LayerInput(spec.clone()).check(&[&meta]) {
            let msg = match e {
                Error::Shape { .. } => format!(
                    "shape mismatch: `{}` is {spec} and expects input {}, but `{}` has shape {}",
                    l.display,
                    spec.expected_input(),
                    src(arg),
                    fmt_dims(&dims)
                ),
                e => format!(
                    "dtype mismatch: `{}` of `{}`: {}",
                    l.display,
                    src(arg),
                    describe_inner(&e)
                ),
            };
            self.err(&arg, msg);
            return Err(());
        }
        if let LayerSpec::Conv2d { .. }
        | LayerSpec::MaxPool2d { .. }
        | LayerSpec::AvgPool2d { .. } = spec
        {
            // Window output sizes divide; symbolic dims cannot, so a plan could not
            // resolve them when it runs.
            if dims.len() == 4 && (dims[2].as_lit().is_none() || dims[3].as_lit().is_none()) {
                self.err(
                    &arg,
                    format!(
                        "`{}` ({spec}) needs the height and width of its input to be integer literals, but `{}` has shape {}; only the batch and channel dims may be `Dyn` or const generics",
                        l.display,
                        src(arg),
                        fmt_dims(&dims)
                    ),
                );
                return Err(());
            }
        }
        let mut leaves = Vec::new();
        for p in spec.params_in(self.mg.precision) {
            leaves.push(self.mg.param(&l.path, &l.key, &p, false));
        }
        for b in spec.buffers() {
            leaves.push(self.mg.param(&l.path, &l.key, &b, true));
        }
        let refs: Vec<&NodeId> = leaves.iter().collect();
        let mode = match self.mode {
            Mode::Train { .. } => {
                let ordinal = self.mg.dropouts;
                if matches!(spec, LayerSpec::Dropout { .. }) {
                    self.mg.dropouts += 1;
                }
                Mode::Train { seed: ordinal }
            }
            Mode::Eval => Mode::Eval,
        };
        let first = self.mg.g.nodes.len();
        let out = match spec.forward(&mut self.mg, &refs, &xn, mode) {
            Ok(o) => {
                self.mg.in_layer(first, &l.key);
                o
            }
            Err(e) => {
                self.err(
                    span,
                    format!(
                        "`{}` ({spec}) cannot run on `{}` of shape {}: {}",
                        l.display,
                        src(arg),
                        fmt_dims(&dims),
                        describe(&e)
                    ),
                );
                return Err(());
            }
        };
        for (name, node) in out.updates {
            self.mg.updates.push(crate::graph::Update {
                layer: l.path.clone(),
                field: format_ident!("{}", name),
                node,
            });
        }
        self.calls.push(Call {
            key: l.key.clone(),
            what: spec.to_string(),
            output: self.shape_str(out.y),
            depth: self.nesting,
            params: Some(spec_params(&spec)),
        });
        Ok(Val::T(out.y))
    }

    /// `self.router.forward::<B, 64>(h)`: a call out to a dynamic part, which the plan
    /// runs when it gets there; the declared dims and dtype are what the rest of the
    /// method sees, and what the part's output is checked against at run time.
    pub(super) fn call_dynamic(&mut self, l: &LayerRef, mc: &syn::ExprMethodCall) -> LResult<Val> {
        if mc.method != "forward" {
            self.err(
                &mc.method,
                format!(
                    "`{0}` is a dynamic part; call it with `{0}.forward::<dims..>(x)`",
                    l.display
                ),
            );
            return Err(());
        }
        let args: Vec<&Expr> = mc.args.iter().collect();
        let [arg] = args.as_slice() else {
            self.err(
                mc,
                format!(
                    "`{}.forward` takes one input, got {}",
                    l.display,
                    args.len()
                ),
            );
            return Err(());
        };
        let turbofish: Vec<&syn::GenericArgument> = mc
            .turbofish
            .as_ref()
            .map(|t| t.args.iter().collect())
            .unwrap_or_default();
        if turbofish.is_empty() {
            self.err(
                mc,
                format!(
                    "declare the shape `{0}` returns: `{0}.forward::<B, 64>({1})` (its dims, then an optional dtype)",
                    l.display,
                    src(arg)
                ),
            );
            return Err(());
        }
        let mut dims = Vec::new();
        let mut dtype = DType::F32;
        for (i, a) in turbofish.iter().enumerate() {
            if let syn::GenericArgument::Type(Type::Path(p)) = a {
                let name = p.path.get_ident().map(|i| i.to_string());
                if let Some(d) = name.as_deref().and_then(crate::dsl::dtype_named) {
                    if i + 1 != turbofish.len() {
                        self.err(a, format!("the dtype `{}` must come last", d.name()));
                        return Err(());
                    }
                    dtype = d;
                    continue;
                }
                if name.as_deref() == Some("Dyn") {
                    self.err(
                        a,
                        format!("declare every dim `{}` returns: a literal or a size of the method (the plan after the call is built for them, so `Dyn` cannot be checked)", l.display),
                    );
                    return Err(());
                }
            }
            dims.push(self.dim_arg(a)?);
        }
        if dims.len() > 6 {
            self.err(
                mc,
                format!(
                    "tensors have rank 0 to 6; this call declares {}",
                    dims.len()
                ),
            );
            return Err(());
        }
        let x = self.lower_expr(arg)?;
        let Val::T(x) = x else {
            if !matches!(x, Val::Unknown) {
                self.err(arg, format!("`{}.forward` takes a tensor", l.display));
            }
            return Err(());
        };
        let site = crate::graph::PartSite {
            path: l.path.clone(),
            display: format!("{}.forward", l.display),
            key: l.key.clone(),
        };
        let y = self.mg.call(site, x, dims, dtype);
        let FieldKind::Dynamic(path) = &l.kind else {
            unreachable!("only called on dynamic parts")
        };
        self.calls.push(Call {
            key: l.key.clone(),
            what: format!("{} (dynamic)", crate::dsl::model_name(path)),
            output: self.shape_str(y),
            depth: self.nesting,
            params: None,
        });
        Ok(Val::T(y))
    }

    /// `self.pos.positions(ids)`: the first `T` rows of a position table, `T` being the
    /// last dim of `ids` (`[T, D]`, which broadcasts against the tokens' `[.., T, D]`);
    /// the positions come from `iota`.
    pub(super) fn positions(
        &mut self,
        l: &LayerRef,
        vocab: usize,
        mc: &syn::ExprMethodCall,
    ) -> LResult<Val> {
        if mc.args.len() != 1 {
            self.err(
                mc,
                format!(
                    "`{}.positions(ids)` takes the ids whose positions it embeds",
                    l.display
                ),
            );
            return Err(());
        }
        let Val::T(ids) = self.lower_expr(&mc.args[0])? else {
            self.err(&mc.args[0], "`.positions()` takes a tensor of ids");
            return Err(());
        };
        let at = match self.mg.positions(&ids, vocab) {
            Ok(n) => n,
            Err(e) => {
                self.err(
                    &mc.args[0],
                    format!(
                        "`{}.positions({})`: {}",
                        l.display,
                        src(&mc.args[0]),
                        describe(&e)
                    ),
                );
                return Err(());
            }
        };
        self.call_layer(l, Val::T(at), &mc.args[0], mc)
    }

    /// `self.tok.attend(h)`: `h · Wᵀ` with the embedding's own table `W` `[V, D]`, the
    /// scores of every token for each row of `h` — an output head tied to the token
    /// embedding (one parameter, whose gradient sums both uses).
    pub(super) fn attend(
        &mut self,
        l: &LayerRef,
        spec: LayerSpec,
        mc: &syn::ExprMethodCall,
    ) -> LResult<Val> {
        if mc.args.len() != 1 {
            self.err(
                mc,
                format!(
                    "`{}.attend(h)` takes the rows to score against the table",
                    l.display
                ),
            );
            return Err(());
        }
        let Val::T(h) = self.lower_expr(&mc.args[0])? else {
            self.err(&mc.args[0], "`.attend()` takes a tensor");
            return Err(());
        };
        let tensors = spec.params_in(self.mg.precision);
        let w = self.mg.param(&l.path, &l.key, &tensors[0], false);
        // An int8 table comes with its scales, after the table.
        let scale = (tensors[0].dtype == DType::I8)
            .then(|| self.mg.param(&l.path, &l.key, &tensors[1], false));
        let y = self.mg.tied_scores(&h, &w, scale.as_ref());
        match y {
            Ok(y) => {
                self.calls.push(Call {
                    key: format!("{}.attend", l.key),
                    what: format!("tied to {spec}"),
                    output: self.shape_str(y),
                    depth: self.nesting,
                    params: Some(0),
                });
                Ok(Val::T(y))
            }
            Err(e) => {
                let what = format!("{}.attend", l.display);
                self.err(mc, refusal(&what, &[src(&mc.args[0])], &e));
                Err(())
            }
        }
    }
}
