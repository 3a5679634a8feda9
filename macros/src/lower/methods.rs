//! Tensor methods (read by the method table's forms and applied by its compositions),
//! elementwise operators and their size arguments.

use super::messages::{describe, refusal, src};
use super::{LResult, Lower, Val};
use crate::dsl::FieldKind;
use kiln_fusion::SDim;
use kiln_tensor::ir::NodeId;
use kiln_tensor::nn::LayerSpec;
use kiln_tensor::{BinaryOp, BuilderExt, DType, Form, Method, MethodArgs, SymDim, UnaryOp};
use quote::ToTokens;
use syn::{Expr, Type};

impl<'a> Lower<'a> {
    pub(super) fn lower_method_call(&mut self, mc: &syn::ExprMethodCall) -> LResult<Val> {
        let method = mc.method.to_string();
        // `self.fc1(x)`: a layer call; `self.helper(x)`: an inlined method call.
        if Self::is_self(&mc.receiver) {
            if let Some(field) = self.field(&method) {
                let l = self.frame.field(&mc.method, field.kind.clone());
                return self.call_layer_args(&l, &mc.args.iter().collect::<Vec<_>>(), mc);
            }
            if let Some(m) = self.methods.iter().find(|m| *m.name() == method).cloned() {
                let args = self.lower_args(&mc.args)?;
                let callee = m.name().to_string();
                return self.inline_call(&m, &callee, &args, mc);
            }
            let known: Vec<String> = self
                .fields
                .iter()
                .map(|f| f.ident.to_string())
                .chain(self.methods.iter().map(|m| m.name().to_string()))
                .collect();
            self.err(
                &mc.method,
                format!(
                    "unknown layer or method `{method}`; this model has {} (a model body calls its fields and the methods of its `#[model] impl`, not those of a plain `impl`)",
                    known.join(", ")
                ),
            );
            return Err(());
        }
        let recv = self.lower_expr(&mc.receiver)?;
        if let Val::Layer(l) = &recv {
            if let FieldKind::Dynamic(_) = &l.kind {
                return self.call_dynamic(l, mc);
            }
            if let FieldKind::Model(_) = &l.kind {
                let args = self.lower_args(&mc.args)?;
                return self.call_model(l, &method, &args, mc);
            }
            if let (FieldKind::Layer(LayerSpec::Embedding { vocab, .. }), "positions") =
                (&l.kind, method.as_str())
            {
                return self.positions(l, *vocab, mc);
            }
            if let (FieldKind::Layer(spec @ LayerSpec::Embedding { .. }), "attend") =
                (&l.kind, method.as_str())
            {
                return self.attend(l, spec.clone(), mc);
            }
            if method == "forward" {
                return self.call_layer_args(l, &mc.args.iter().collect::<Vec<_>>(), mc);
            }
            self.err(
                &mc.method,
                format!(
                    "`{}` is a layer; call it with `{}(x)` or `.forward(x)`",
                    l.display, l.display
                ),
            );
            return Err(());
        }
        let Val::T(n) = recv else {
            self.err(&mc.receiver, format!("`.{method}()` needs a tensor"));
            return Err(());
        };
        self.tensor_method(n, mc)
    }

    pub(super) fn unary(&mut self, n: NodeId, op: UnaryOp, span: &dyn ToTokens) -> LResult<Val> {
        match self.mg.unary(op, &n) {
            Ok(y) => Ok(Val::T(y)),
            Err(e) => {
                self.err(span, describe(&e));
                Err(())
            }
        }
    }

    /// `x.method(..)` on a tensor: an elementwise op of the op table, or a method of
    /// the method table (`kiln_tensor::for_each_method!`), read by its form and
    /// applied to the graph by the table's own composition.
    pub(super) fn tensor_method(&mut self, n: NodeId, mc: &syn::ExprMethodCall) -> LResult<Val> {
        let name = mc.method.to_string();
        let span: &dyn ToTokens = mc;
        let nargs = mc.args.len();
        let unary = UnaryOp::ALL
            .iter()
            .copied()
            // Model bodies compute in floats: the ops a float tensor takes.
            .find(|u| u.method() == name && u.accepts(DType::F32));
        let (form, method) = match (unary, Method::from_name(&name)) {
            (Some(op), _) => (Form::Plain, Err(op)),
            (None, Some(m)) => (m.form(), Ok(m)),
            (None, None) => {
                self.err(&mc.method, format!("unknown tensor method `.{name}()`; see the kiln-macros docs for the methods model bodies support"));
                return Err(());
            }
        };
        // A turbofish the method would not read is an error, never ignored.
        if let (false, Some(t)) = (form.takes_turbofish(), &mc.turbofish) {
            let hint = match form {
                Form::AxisArg => format!(": the axis is an argument, `.{name}(AXIS)`"),
                _ => String::new(),
            };
            self.err(t, format!("`.{name}()` takes no `::<..>` arguments{hint}"));
            return Err(());
        }
        let arity_fits = match form {
            Form::AxisArg => nargs <= 1,
            f => nargs == f.arguments(),
        };
        if !arity_fits {
            // `x.mean(1)`: the axis written as an argument.
            if let (Form::AxisTurbofish, [axis]) =
                (form, mc.args.iter().collect::<Vec<_>>().as_slice())
            {
                self.err(
                    span,
                    format!(
                        "`.{name}()` takes its axis in `::<..>`, not as an argument: write `.{name}::<{}>()`",
                        src(axis)
                    ),
                );
                return Err(());
            }
            let hint = format!("; write `{}`", form.spelling(&name));
            self.err(
                span,
                format!(
                    "`.{name}()` takes {} argument(s), got {nargs}{hint}",
                    form.arguments()
                ),
            );
            return Err(());
        }
        let method = match method {
            Err(op) => return self.unary(n, op, span),
            Ok(m) => m,
        };
        let turbofish: Vec<&syn::GenericArgument> = mc
            .turbofish
            .as_ref()
            .map(|t| t.args.iter().collect())
            .unwrap_or_default();
        let one_axis = |s: &mut Self| -> LResult<usize> {
            match turbofish.as_slice() {
                [a] => s.const_usize(a),
                _ => {
                    let all = format!("{name}_all");
                    let or_all = Method::from_name(&all)
                        .map(|_| format!(" (or `.{all}()`)"))
                        .unwrap_or_default();
                    s.err(span, format!("write `{}`{or_all}", form.spelling(&name)));
                    Err(())
                }
            }
        };
        let mut operands = vec![src(&mc.receiver)];
        let takes_tensor = matches!(form, Form::Tensor | Form::AxisTensor | Form::TensorScalar);
        let rhs = if takes_tensor {
            let e = &mc.args[0];
            let Val::T(r) = self.lower_expr(e)? else {
                self.err(e, format!("`.{name}()` takes a tensor"));
                return Err(());
            };
            operands.push(src(e));
            r
        } else {
            n
        };
        let args = match form {
            Form::Plain => MethodArgs::None,
            Form::AxisArg => MethodArgs::Axis(self.axis_arg(mc)?),
            Form::AxisTurbofish => MethodArgs::Axis(Some(one_axis(self)?)),
            Form::Dims => {
                let mut dims = Vec::new();
                for a in &turbofish {
                    dims.push(self.reshape_dim_arg(a)?);
                }
                MethodArgs::Dims(dims)
            }
            Form::Perm => MethodArgs::Perm(
                turbofish
                    .iter()
                    .map(|a| self.const_usize(a))
                    .collect::<LResult<_>>()?,
            ),
            Form::AxisRange => match turbofish.as_slice() {
                [axis, start, len] => MethodArgs::AxisRange(
                    self.const_usize(axis)?,
                    self.const_usize(start)?,
                    self.const_usize(len)?,
                ),
                _ => {
                    self.err(span, format!("write `{}`", form.spelling(&name)));
                    return Err(());
                }
            },
            Form::DType => {
                let dt = match turbofish.as_slice() {
                    [syn::GenericArgument::Type(Type::Path(p))] => p
                        .path
                        .get_ident()
                        .and_then(|i| crate::dsl::dtype_named(&i.to_string())),
                    _ => None,
                };
                let Some(dt) = dt else {
                    self.err(
                        span,
                        "write `.cast::<f16>()` with one of f32, f64, f16, bf16, i32, u32, bool",
                    );
                    return Err(());
                };
                MethodArgs::DType(dt)
            }
            Form::Tensor => MethodArgs::Tensor(&rhs),
            Form::AxisTensor => MethodArgs::AxisTensor(one_axis(self)?, &rhs),
            Form::TensorScalar => match self.lower_expr(&mc.args[1])? {
                Val::Scalar(s) => MethodArgs::TensorScalar(&rhs, s),
                _ => {
                    self.err(
                        &mc.args[1],
                        format!("the second argument of `.{name}()` must be a number"),
                    );
                    return Err(());
                }
            },
        };
        match method.apply(&mut self.mg, &n, args) {
            Ok(y) => Ok(Val::T(y)),
            Err(e) => {
                self.err(span, refusal(method.name(), &operands, &e));
                Err(())
            }
        }
    }

    pub(super) fn lower_binary(&mut self, b: &syn::ExprBinary) -> LResult<Val> {
        let op = match b.op {
            syn::BinOp::Add(_) => BinaryOp::Add,
            syn::BinOp::Sub(_) => BinaryOp::Sub,
            syn::BinOp::Mul(_) => BinaryOp::Mul,
            syn::BinOp::Div(_) => BinaryOp::Div,
            _ => {
                self.err(
                    &b.op,
                    "only + - * / are supported between tensors in model methods",
                );
                return Err(());
            }
        };
        let sym = match op {
            BinaryOp::Add => "+",
            BinaryOp::Sub => "-",
            BinaryOp::Mul => "*",
            _ => "/",
        };
        let l = self.lower_expr(&b.left);
        let r = self.lower_expr(&b.right);
        let (l, r) = (l?, r?);
        let span: &dyn ToTokens = b;
        match (l, r) {
            (Val::Scalar(x), Val::Scalar(y)) => Ok(Val::Scalar(op.eval(x, y))),
            (Val::T(n), Val::Scalar(s)) => {
                let y = match op {
                    BinaryOp::Add => self.mg.add_scalar(&n, s),
                    BinaryOp::Sub => self.mg.add_scalar(&n, -s),
                    BinaryOp::Mul => self.mg.mul_scalar(&n, s),
                    _ => self.mg.mul_scalar(&n, 1.0 / s),
                };
                self.scalar_result(y, span)
            }
            (Val::Scalar(s), Val::T(n)) => {
                let y = match op {
                    BinaryOp::Add => self.mg.add_scalar(&n, s),
                    BinaryOp::Mul => self.mg.mul_scalar(&n, s),
                    BinaryOp::Sub => self
                        .mg
                        .unary(UnaryOp::Neg, &n)
                        .and_then(|m| self.mg.add_scalar(&m, s)),
                    _ => self
                        .mg
                        .unary(UnaryOp::Recip, &n)
                        .and_then(|m| self.mg.mul_scalar(&m, s)),
                };
                self.scalar_result(y, span)
            }
            (Val::T(a), Val::T(bn)) => match self.mg.checked_binary(op, &a, &bn) {
                Ok(y) => Ok(Val::T(y)),
                Err(e) => {
                    let operands = [src(&b.left), src(&b.right)];
                    self.err(span, refusal(sym, &operands, &e));
                    Err(())
                }
            },
            _ => {
                self.err(span, format!("`{sym}` works on tensors and numbers"));
                Err(())
            }
        }
    }

    pub(super) fn scalar_result(
        &mut self,
        y: kiln_tensor::Result<NodeId>,
        span: &dyn ToTokens,
    ) -> LResult<Val> {
        match y {
            Ok(y) => Ok(Val::T(y)),
            Err(e) => {
                self.err(span, describe(&e));
                Err(())
            }
        }
    }

    /// The optional axis argument of `.softmax(AXIS)`: an integer literal.
    pub(super) fn axis_arg(&mut self, mc: &syn::ExprMethodCall) -> LResult<Option<usize>> {
        match mc.args.first() {
            None => Ok(None),
            Some(Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Int(i),
                ..
            })) => Ok(Some(i.base10_parse().map_err(|_| ())?)),
            Some(other) => {
                self.err(&other, "the axis must be an integer literal");
                Err(())
            }
        }
    }

    pub(super) fn const_usize(&mut self, a: &syn::GenericArgument) -> LResult<usize> {
        if let syn::GenericArgument::Const(e) = a {
            match crate::arith::const_int(e) {
                Some(Ok(v)) if (0..=crate::dsl::MAX_SIZE as i128).contains(&v) => {
                    return Ok(v as usize)
                }
                Some(Err(m)) => {
                    self.err(&a, m);
                    return Err(());
                }
                _ => {}
            }
        }
        self.err(
            &a,
            "expected a whole number (a literal, a size of the model, or arithmetic over them)",
        );
        Err(())
    }

    /// A reshape's target size: `Dyn` is a size solved from the element count (`None`).
    pub(super) fn reshape_dim_arg(&mut self, a: &syn::GenericArgument) -> LResult<Option<SDim>> {
        match a {
            syn::GenericArgument::Type(Type::Path(p)) if p.path.is_ident("Dyn") => Ok(None),
            _ => self.dim_arg(a).map(Some),
        }
    }

    pub(super) fn dim_arg(&mut self, a: &syn::GenericArgument) -> LResult<SDim> {
        match a {
            syn::GenericArgument::Const(_) => self.const_usize(a).map(SDim::lit),
            syn::GenericArgument::Type(Type::Path(p)) if p.path.get_ident().is_some() => {
                let id = p.path.get_ident().expect("checked").to_string();
                if id == "Dyn" {
                    return Ok(SDim::fresh_runtime());
                }
                match self.consts.last().and_then(|f| f.get(&id)) {
                    Some(d) => Ok(d.clone()),
                    None => {
                        self.err(&a, format!("unknown dim `{id}`"));
                        Err(())
                    }
                }
            }
            other => {
                self.err(
                    &other,
                    "a dim must be an integer literal, a const generic or `Dyn`",
                );
                Err(())
            }
        }
    }
}
