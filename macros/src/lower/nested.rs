//! Calls of nested models and of the impl's other methods: inlined into the caller's
//! graph, their arguments checked against the callee's signature.

use super::messages::src;
use super::{model_params, Call, Frame, LResult, LayerRef, Lower, Val};
use crate::dsl::FieldKind;
use crate::model::{Defs, MethodSig};
use kiln_fusion::SDim;
use kiln_tensor::op::fmt_dims;
use kiln_tensor::SymDim;
use quote::ToTokens;
use std::collections::HashMap;
use syn::Expr;

impl<'a> Lower<'a> {
    /// Lowers call arguments in the caller's frame: each value with its expression.
    pub(super) fn lower_args<'e>(
        &mut self,
        args: &'e syn::punctuated::Punctuated<Expr, syn::Token![,]>,
    ) -> LResult<Vec<(Val, &'e Expr)>> {
        let vals: Vec<LResult<Val>> = args.iter().map(|a| self.lower_expr(a)).collect();
        vals.into_iter()
            .zip(args)
            .map(|(v, a)| v.map(|v| (v, a)))
            .collect()
    }

    /// Calls `method` of the nested model `l` with `args`: its body is inlined with
    /// `self` being `l` (its layers' parameters are the top model's, named
    /// `blocks.0.fc1.weight`), its arguments checked against its signature.
    pub(super) fn call_model(
        &mut self,
        l: &LayerRef,
        method: &str,
        args: &[(Val, &Expr)],
        span: &dyn ToTokens,
    ) -> LResult<Val> {
        let FieldKind::Model(path) = &l.kind else {
            unreachable!("only called on nested models")
        };
        let key = crate::dsl::model_name(path);
        let name = crate::model::display_name(&key);
        let defs: &'a Defs = self.defs;
        let Some(def) = defs.get(&key) else {
            self.err(
                span,
                format!(
                    "`{}` is a `{name}`, whose `#[model] impl` was not found",
                    l.display
                ),
            );
            return Err(());
        };
        if def.broken {
            return Err(());
        }
        let Some(m) = def.methods.iter().find(|m| *m.name() == method) else {
            let known: Vec<String> = def
                .methods
                .iter()
                .map(|m| format!("`{}`", m.name()))
                .collect();
            self.err(
                span,
                format!(
                    "`{}` is a `{name}`, which has no method `{method}`; its methods are {}",
                    l.display,
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                ),
            );
            return Err(());
        };
        let at = self.calls.len();
        self.calls.push(Call {
            key: l.key.clone(),
            what: name.clone(),
            output: String::new(),
            depth: self.nesting,
            params: Some(model_params(&def.fields, defs)),
        });
        let saved = (
            self.fields,
            self.methods,
            std::mem::replace(&mut self.frame, Frame::of(l)),
        );
        self.fields = &def.fields;
        self.methods = &def.methods;
        self.nesting += 1;
        let first = self.mg.g.nodes.len();
        let r = self.inline_call(m, &format!("{}.{method}", l.display), args, span);
        // What its body computed outside its own layers is the nested model's.
        self.mg.in_layer(first, &l.key);
        self.nesting -= 1;
        (self.fields, self.methods, self.frame) = saved;
        if let Ok(Val::T(y)) = &r {
            self.calls[at].output = self.shape_str(*y);
        }
        r
    }

    /// Inlines a call of `m` (messages name it `callee`) with `args` lowered by the
    /// caller, checking them against its signature.
    pub(super) fn inline_call(
        &mut self,
        m: &MethodSig,
        callee: &str,
        args: &[(Val, &Expr)],
        span: &dyn ToTokens,
    ) -> LResult<Val> {
        if self.depth > 16 {
            self.err(
                span,
                "model methods call each other too deeply (recursion is not supported)",
            );
            return Err(());
        }
        if args.len() != m.args.len() {
            self.err(
                span,
                format!(
                    "`{}` takes {} arguments, got {}",
                    callee,
                    m.args.len(),
                    args.len()
                ),
            );
            return Err(());
        }
        let mut frame: HashMap<String, SDim> = HashMap::new();
        let mut bound = Vec::new();
        for ((v, arg), (pname, pty)) in args.iter().zip(&m.args) {
            let Val::T(n) = v.clone() else {
                self.err(&arg, format!("`{}` takes a tensor for `{pname}`", callee));
                return Err(());
            };
            let got = self.dims(n);
            if got.len() != pty.dims.len() || self.dtype(n) != pty.dtype {
                self.err(
                    &arg,
                    format!(
                        "`{}` takes `{pname}` of rank {} {}, but `{}` has shape {} {}",
                        callee,
                        pty.dims.len(),
                        pty.dtype,
                        src(arg),
                        fmt_dims(&got),
                        self.dtype(n)
                    ),
                );
                return Err(());
            }
            for (d, g) in pty.dims.iter().zip(&got) {
                match d {
                    crate::dsl::DimTok::Lit(l) => {
                        if g.matches(&SDim::lit(*l)) == Some(false) {
                            self.err(&arg, format!("shape mismatch: `{}` takes `{pname}` with a dim of {l}, but `{}` has shape {}", callee, src(arg), fmt_dims(&got)));
                            return Err(());
                        }
                    }
                    crate::dsl::DimTok::Param(p) => {
                        let key = p.to_string();
                        if let Some(prev) = frame.get(&key) {
                            if prev.matches(g) == Some(false) {
                                self.err(&arg, format!("shape mismatch: `{}` needs `{key}` = {prev} from an earlier argument, but `{}` has {g} there", callee, src(arg)));
                                return Err(());
                            }
                        } else {
                            frame.insert(key, g.clone());
                        }
                    }
                    crate::dsl::DimTok::Dyn => {}
                }
            }
            bound.push((pname.to_string(), n));
        }
        for c in &m.consts {
            if !frame.contains_key(&c.to_string()) {
                self.err(span, format!("`{}`'s const generic `{c}` does not appear in its arguments, so it cannot be inferred", callee));
                return Err(());
            }
        }
        // Lower the callee's body in its own scope, its const generics bound to the
        // caller's dims.
        let saved_scopes = std::mem::replace(&mut self.scopes, vec![HashMap::new()]);
        self.consts.push(frame);
        self.depth += 1;
        for (name, n) in &bound {
            self.bind(name, Val::T(*n));
        }
        let r = self.lower_block_stmts(&m.item.block.stmts, &m.item.block);
        let r = r.and_then(|v| self.check_result(m, v, span));
        self.depth -= 1;
        self.consts.pop();
        self.scopes = saved_scopes;
        r
    }
}
