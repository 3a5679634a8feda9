//! The check phase: lowering a method body. Every expression becomes nodes of the
//! graph, built by the op and method tables' rules on symbolic dims; a refusal is
//! reported on the exact sub-expression, naming both shapes, and lowering goes on so
//! that independent mistakes are all reported at once. Calls of layers and dynamic
//! parts are in `layers`, of nested models and sibling methods in `nested`, tensor
//! methods and operators in `methods`, and the wording of messages in `messages`.

mod layers;
pub mod messages;
mod methods;
mod nested;

use crate::dsl::{parse_tensor_type, FieldKind, TensorTy};
use crate::graph::MGraph;
use crate::model::FinalExpr;
use crate::model::{Defs, MethodSig, ModelField};
use kiln_fusion::SDim;
use kiln_tensor::ir::NodeId;
use kiln_tensor::nn::{LayerSpec, Mode};
use kiln_tensor::op::fmt_dims;
use kiln_tensor::{DType, Precision, SymDim, UnaryOp};
use messages::{src, unsupported_expression};
use proc_macro2::TokenStream;
use quote::{format_ident, quote, ToTokens};
use std::collections::HashMap;
use syn::{Expr, Ident, Pat, Stmt};

/// A layer reachable from `self`.
#[derive(Clone)]
pub struct LayerRef {
    /// The expression for it (`self.fc1`, `self.blocks[2]`).
    pub path: TokenStream,
    /// How messages name it (`self.fc1`).
    pub display: String,
    /// Its checkpoint prefix (`fc1`, `blocks.2`).
    pub key: String,
    /// What it is.
    pub kind: FieldKind,
}

/// One call a lowered body made: of a layer or of a nested model.
pub struct Call {
    /// How the model reaches it (`blocks.0.attn`).
    pub key: String,
    /// What it is (`Linear<16, 16>`, `CausalSelfAttention`).
    pub what: String,
    /// The shape of what it returned.
    pub output: String,
    /// How many levels of nesting it sits under.
    pub depth: usize,
    /// Its parameter count (`None` for a dynamic part: its sizes are run-time values).
    pub params: Option<usize>,
}

/// Where `self` of the body being lowered is, seen from the top model.
#[derive(Clone)]
pub(crate) struct Frame {
    /// The expression (`self`, `self.blocks[0]`).
    path: TokenStream,
    /// How messages name it (`self`, `self.blocks[0]`).
    display: String,
    /// Its checkpoint prefix (empty, `blocks.0`).
    key: String,
}

impl Frame {
    /// The top model's `self`.
    fn top() -> Self {
        Frame {
            path: quote!(self),
            display: "self".into(),
            key: String::new(),
        }
    }

    /// The frame of a nested model reached as `l`.
    fn of(l: &LayerRef) -> Self {
        Frame {
            path: l.path.clone(),
            display: l.display.clone(),
            key: l.key.clone(),
        }
    }

    /// The field `name` of this frame's model: read directly from the top model, through
    /// its hidden accessor from a nested one (whose fields may be private to its module).
    fn field(&self, name: &Ident, kind: FieldKind) -> LayerRef {
        let path = &self.path;
        let path = if self.key.is_empty() {
            quote!(#path.#name)
        } else {
            let accessor = format_ident!("__kiln_field_{}", name);
            match kind {
                // A place, not a reference: the plan borrows it as a trait object.
                FieldKind::Dynamic(_) => quote!((*#path.#accessor())),
                _ => quote!(#path.#accessor()),
            }
        };
        LayerRef {
            path,
            display: format!("{}.{name}", self.display),
            key: kiln_tensor::nn::join(&self.key, &name.to_string()),
            kind,
        }
    }
}

/// A value during lowering.
#[derive(Clone)]
pub enum Val {
    /// A tensor: its node.
    T(NodeId),
    /// A layer or an array of layers.
    Layer(LayerRef),
    /// A tuple.
    Tuple(Vec<Val>),
    /// A numeric literal.
    Scalar(f64),
    /// The result of an expression that failed to lower (already reported).
    Unknown,
}

/// Lowers method bodies of one model.
pub struct Lower<'a> {
    /// The fields of the model whose body is being lowered (a nested model's while
    /// one of its methods is inlined).
    pub fields: &'a [ModelField],
    /// Its methods (for inlining calls between them).
    pub methods: &'a [MethodSig],
    /// The definitions of the nested models, by name.
    defs: &'a Defs,
    /// Where `self` of the current body is, seen from the top model.
    frame: Frame,
    /// Every layer and nested model the lowered body called, in call order (a nested
    /// model before its own layers): what `summary()` lists.
    pub calls: Vec<Call>,
    /// How many nested models the current body sits in.
    nesting: usize,
    /// The graph.
    pub mg: MGraph,
    /// Training or evaluation semantics.
    pub mode: Mode,
    /// Errors found so far.
    pub errors: Vec<syn::Error>,
    scopes: Vec<HashMap<String, Val>>,
    /// The const generics in scope (inlined methods map theirs to the caller's dims).
    consts: Vec<HashMap<String, SDim>>,
    depth: usize,
}

pub(crate) type LResult<T> = Result<T, ()>;

impl<'a> Lower<'a> {
    /// A lowering of `methods` of a model with `fields`, its ops typed by `precision`.
    pub fn new(
        fields: &'a [ModelField],
        methods: &'a [MethodSig],
        defs: &'a Defs,
        mode: Mode,
        precision: Precision,
    ) -> Self {
        Lower {
            fields,
            methods,
            defs,
            frame: Frame::top(),
            calls: Vec::new(),
            nesting: 0,
            mg: MGraph::new(precision),
            mode,
            errors: Vec::new(),
            scopes: vec![HashMap::new()],
            consts: vec![],
            depth: 0,
        }
    }

    /// Reports an error underlining all of `at` (a whole sub-expression on stable
    /// rustc too: `new_spanned` spans the first to the last token).
    fn err(&mut self, at: &dyn ToTokens, msg: impl Into<String>) {
        self.errors
            .push(syn::Error::new_spanned(at.to_token_stream(), msg.into()));
    }

    fn dims(&self, n: NodeId) -> Vec<SDim> {
        self.mg.g.nodes[n].meta.dims.clone()
    }

    fn dtype(&self, n: NodeId) -> DType {
        self.mg.g.nodes[n].meta.dtype
    }

    fn shape_str(&self, n: NodeId) -> String {
        fmt_dims(&self.dims(n))
    }

    fn bind(&mut self, name: &str, v: Val) {
        self.scopes
            .last_mut()
            .expect("a scope")
            .insert(name.to_string(), v);
    }

    fn lookup(&self, name: &str) -> Option<Val> {
        self.scopes.iter().rev().find_map(|s| s.get(name).cloned())
    }

    fn resolve_dims(&self, ty: &TensorTy) -> Vec<SDim> {
        let frame = self.consts.last();
        ty.dims
            .iter()
            .map(|d| match d {
                crate::dsl::DimTok::Lit(n) => SDim::lit(*n),
                crate::dsl::DimTok::Param(p) => frame
                    .and_then(|f| f.get(&p.to_string()).cloned())
                    .unwrap_or_else(|| SDim::param(&p.to_string())),
                crate::dsl::DimTok::Dyn => SDim::fresh_runtime(),
            })
            .collect()
    }

    // ---- method bodies ------------------------------------------------------------
    /// Lowers a top-level method: arguments become inputs; returns the result value.
    pub fn lower_method(&mut self, m: &MethodSig) -> LResult<Val> {
        let frame: HashMap<String, SDim> = m
            .consts
            .iter()
            .map(|c| (c.to_string(), SDim::param(&c.to_string())))
            .collect();
        self.consts.push(frame);
        for (name, ty) in &m.args {
            let dims = self.resolve_dims(ty);
            let n = self.mg.input(name.clone(), dims, ty.dtype);
            self.bind(&name.to_string(), Val::T(n));
        }
        let r = self.lower_block_stmts(&m.item.block.stmts, &m.item.block);
        let r = r.and_then(|v| self.check_result(m, v, &FinalExpr(m)));
        self.consts.pop();
        r
    }

    /// Checks the body's value against the declared result.
    fn check_result(&mut self, m: &MethodSig, v: Val, span: &dyn ToTokens) -> LResult<Val> {
        let parts: Vec<Val> = match (&v, m.ret_tuple) {
            (Val::Unknown, _) => return Err(()),
            (Val::Tuple(p), true) => p.clone(),
            (Val::T(..), false) => vec![v.clone()],
            _ => {
                let want = if m.ret_tuple {
                    "a tuple of tensors"
                } else {
                    "a tensor"
                };
                self.err(
                    span,
                    format!(
                        "`{}` returns {want}, but the body produces something else",
                        m.name()
                    ),
                );
                return Err(());
            }
        };
        if parts.len() != m.ret.len() {
            self.err(
                span,
                format!(
                    "`{}` returns {} tensors, but the body produces {}",
                    m.name(),
                    m.ret.len(),
                    parts.len()
                ),
            );
            return Err(());
        }
        for (p, want) in parts.iter().zip(&m.ret) {
            let Val::T(n) = p else {
                self.err(span, "expected a tensor here");
                return Err(());
            };
            let want_dims = self.resolve_dims(want);
            let got = self.dims(*n);
            let rank_ok = got.len() == want_dims.len();
            let mut bad = !rank_ok;
            let mut dyn_for_static = false;
            if rank_ok {
                for (g, w) in got.iter().zip(&want_dims) {
                    match g.matches(w) {
                        Some(false) => bad = true,
                        None if w.as_runtime().is_none() && g.as_runtime().is_some() => {
                            dyn_for_static = true
                        }
                        _ => {}
                    }
                }
            }
            if bad {
                self.err(
                    span,
                    format!(
                        "shape mismatch: `{}` returns {} but the body produces {}",
                        m.name(),
                        fmt_dims(&want_dims),
                        fmt_dims(&got)
                    ),
                );
                return Err(());
            }
            if dyn_for_static {
                self.err(
                    span,
                    format!(
                        "`{}` returns {}, but the body produces {}: a size known only at run time (Dyn) where the signature requires a static one",
                        m.name(),
                        fmt_dims(&want_dims),
                        fmt_dims(&got)
                    ),
                );
                return Err(());
            }
            if self.dtype(*n) != want.dtype {
                self.err(
                    span,
                    format!(
                        "dtype mismatch: `{}` returns {} but the body produces {}",
                        m.name(),
                        want.dtype,
                        self.dtype(*n)
                    ),
                );
                return Err(());
            }
        }
        Ok(v)
    }

    fn lower_block_stmts(&mut self, stmts: &[Stmt], span: &dyn ToTokens) -> LResult<Val> {
        let mut last = None;
        for (i, s) in stmts.iter().enumerate() {
            let is_last = i + 1 == stmts.len();
            match s {
                Stmt::Local(local) => {
                    let Some(init) = &local.init else {
                        self.err(&local, "a `let` in a model method needs a value");
                        continue;
                    };
                    if init.diverge.is_some() {
                        self.err(&local, "`let ... else` is not supported in model methods");
                        continue;
                    }
                    let v = self.lower_expr(&init.expr).unwrap_or(Val::Unknown);
                    self.bind_pat(&local.pat, v, &init.expr);
                }
                Stmt::Expr(e, semi) => {
                    if let Expr::ForLoop(f) = e {
                        self.lower_for(f);
                        continue;
                    }
                    if let Expr::Assign(a) = e {
                        let v = self.lower_expr(&a.right).unwrap_or(Val::Unknown);
                        match &*a.left {
                            Expr::Path(p) if p.path.get_ident().is_some() => {
                                let name = p.path.get_ident().expect("checked").to_string();
                                if self.lookup(&name).is_none() {
                                    self.err(
                                        &p,
                                        format!("cannot assign to unknown variable `{name}`"),
                                    );
                                    continue;
                                }
                                self.bind_name(&name, v, &a.right);
                            }
                            other => self.err(
                                &other,
                                "only plain variables can be assigned in model methods",
                            ),
                        }
                        continue;
                    }
                    // `return x;`, `if ..`, `while ..`: say what the construct is, once
                    // (the body then has no value to report as missing).
                    if matches!(
                        e,
                        Expr::Return(_)
                            | Expr::If(_)
                            | Expr::Match(_)
                            | Expr::While(_)
                            | Expr::Loop(_)
                    ) {
                        self.err(&e, unsupported_expression(e));
                        last = Some(Err(()));
                        continue;
                    }
                    if semi.is_some() || !is_last {
                        self.err(&e, "a statement in a model method must be a `let`, an assignment or a `for` loop over layers");
                        continue;
                    }
                    last = Some(self.lower_expr(e));
                }
                Stmt::Item(it) => self.err(&it, "items cannot be declared inside model methods"),
                Stmt::Macro(m) => self.err(&m, "macros are not supported inside model methods"),
            }
        }
        match last {
            Some(v) => v,
            None => {
                self.err(
                    span,
                    "a model method block must end with the value it returns",
                );
                Err(())
            }
        }
    }

    fn bind_pat(&mut self, pat: &Pat, v: Val, expr: &Expr) {
        match pat {
            Pat::Ident(pi) => self.bind_name(&pi.ident.to_string(), v, expr),
            Pat::Type(pt) => {
                let consts: Vec<Ident> = self
                    .consts
                    .last()
                    .map(|f| f.keys().map(|k| format_ident!("{}", k)).collect())
                    .unwrap_or_default();
                match parse_tensor_type(&pt.ty, &consts) {
                    Ok(Some(ty)) => {
                        if let Val::T(n) = &v {
                            let want = self.resolve_dims(&ty);
                            let got = self.dims(*n);
                            let ok = want.len() == got.len()
                                && want
                                    .iter()
                                    .zip(&got)
                                    .all(|(a, b)| a.matches(b) != Some(false));
                            if !ok || ty.dtype != self.dtype(*n) {
                                self.err(
                                    &expr,
                                    format!(
                                        "shape mismatch: `{}` is annotated {} {} but the expression has shape {} {}",
                                        src(&pt.pat),
                                        fmt_dims(&want),
                                        ty.dtype,
                                        fmt_dims(&got),
                                        self.dtype(*n)
                                    ),
                                );
                                self.bind_pat(&pt.pat, Val::Unknown, expr);
                                return;
                            }
                        }
                        self.bind_pat(&pt.pat, v, expr)
                    }
                    Ok(None) => self.err(&pt.ty, "expected a tensor type like `Tensor<B, 10>`"),
                    Err(e) => self.errors.push(e),
                }
            }
            Pat::Tuple(pt) => match v {
                Val::Tuple(parts) if parts.len() == pt.elems.len() => {
                    for (p, part) in pt.elems.iter().zip(parts) {
                        self.bind_pat(p, part, expr);
                    }
                }
                Val::Unknown => {
                    for p in &pt.elems {
                        self.bind_pat(p, Val::Unknown, expr);
                    }
                }
                _ => self.err(&pat, "this pattern does not match the value's tuple shape"),
            },
            Pat::Wild(_) => {}
            other => self.err(&other, "use a name or a tuple of names here"),
        }
    }

    fn bind_name(&mut self, name: &str, v: Val, _expr: &Expr) {
        if let Val::T(n) = v {
            self.mg.name(n, name);
        }
        self.bind(name, v);
    }

    fn lower_for(&mut self, f: &syn::ExprForLoop) {
        let iter = match &*f.expr {
            Expr::Reference(r) => &*r.expr,
            Expr::MethodCall(mc) if mc.method == "iter" && mc.args.is_empty() => &*mc.receiver,
            other => other,
        };
        let Ok(Val::Layer(arr)) = self.lower_expr(iter) else {
            self.err(&f.expr, "a `for` loop in a model method must run over an array of layers: `for layer in &self.blocks`");
            return;
        };
        let FieldKind::Array(inner, n) = &arr.kind else {
            self.err(
                &f.expr,
                format!(
                    "`{}` is a single layer, not an array of layers",
                    arr.display
                ),
            );
            return;
        };
        let Pat::Ident(pi) = &*f.pat else {
            self.err(&f.pat, "name the loop variable with a plain identifier");
            return;
        };
        for i in 0..*n {
            let path = &arr.path;
            let idx = proc_macro2::Literal::usize_unsuffixed(i);
            let layer = LayerRef {
                path: quote!(#path[#idx]),
                display: format!("{}[{i}]", arr.display),
                key: kiln_tensor::nn::join(&arr.key, &i.to_string()),
                kind: (**inner).clone(),
            };
            self.scopes.push(HashMap::new());
            let value = self.field_value(layer);
            self.bind(&pi.ident.to_string(), value);
            for s in &f.body.stmts {
                match s {
                    Stmt::Expr(Expr::Assign(a), _) => {
                        let v = self.lower_expr(&a.right).unwrap_or(Val::Unknown);
                        match &*a.left {
                            Expr::Path(p) if p.path.get_ident().is_some() => {
                                let name = p.path.get_ident().expect("checked").to_string();
                                // Assignments inside the loop rebind the outer variable.
                                self.scopes.pop();
                                if self.lookup(&name).is_none() {
                                    self.err(
                                        &p,
                                        format!("cannot assign to unknown variable `{name}`"),
                                    );
                                } else {
                                    self.bind_name(&name, v, &a.right);
                                }
                                self.scopes.push(HashMap::new());
                                let layer_val = self.field_value(LayerRef {
                                    path: quote!(#path[#idx]),
                                    display: format!("{}[{i}]", arr.display),
                                    key: kiln_tensor::nn::join(&arr.key, &i.to_string()),
                                    kind: (**inner).clone(),
                                });
                                self.bind(&pi.ident.to_string(), layer_val);
                            }
                            other => self.err(
                                &other,
                                "only plain variables can be assigned in model methods",
                            ),
                        }
                    }
                    Stmt::Local(local) => {
                        let Some(init) = &local.init else {
                            self.err(&local, "a `let` needs a value");
                            continue;
                        };
                        let v = self.lower_expr(&init.expr).unwrap_or(Val::Unknown);
                        self.bind_pat(&local.pat, v, &init.expr);
                    }
                    other => self.err(
                        &other,
                        "a loop body may hold `let` statements and assignments",
                    ),
                }
            }
            self.scopes.pop();
        }
    }

    // ---- expressions ----------------------------------------------------------------
    /// Lowers an expression. `Err(())` means an error was reported.
    pub fn lower_expr(&mut self, e: &Expr) -> LResult<Val> {
        match e {
            Expr::Paren(p) => self.lower_expr(&p.expr),
            Expr::Group(g) => self.lower_expr(&g.expr),
            Expr::Reference(r) => self.lower_expr(&r.expr),
            Expr::Lit(l) => match &l.lit {
                syn::Lit::Float(f) => Ok(Val::Scalar(f.base10_parse().map_err(|_| ())?)),
                syn::Lit::Int(i) => {
                    Ok(Val::Scalar(i.base10_parse::<i64>().map_err(|_| ())? as f64))
                }
                _ => {
                    self.err(&l, "only numeric literals can appear in model methods");
                    Err(())
                }
            },
            Expr::Path(p) => {
                let Some(id) = p.path.get_ident() else {
                    self.err(&p, "unknown name in a model method");
                    return Err(());
                };
                match self.lookup(&id.to_string()) {
                    Some(Val::Unknown) => Err(()),
                    Some(v) => Ok(v),
                    None => {
                        self.err(&id, format!("unknown variable `{id}`"));
                        Err(())
                    }
                }
            }
            Expr::Tuple(t) => {
                let parts: Vec<Val> = t
                    .elems
                    .iter()
                    .map(|x| self.lower_expr(x).unwrap_or(Val::Unknown))
                    .collect();
                if parts.iter().any(|p| matches!(p, Val::Unknown)) {
                    return Err(());
                }
                Ok(Val::Tuple(parts))
            }
            Expr::Block(b) => {
                self.scopes.push(HashMap::new());
                let r = self.lower_block_stmts(&b.block.stmts, b);
                self.scopes.pop();
                r
            }
            Expr::Field(f) => self.lower_field(f),
            Expr::Index(ix) => {
                let base = self.lower_expr(&ix.expr)?;
                let Val::Layer(arr) = base else {
                    self.err(&ix, "only arrays of layers can be indexed in model methods");
                    return Err(());
                };
                let FieldKind::Array(inner, n) = &arr.kind else {
                    self.err(&ix, format!("`{}` is not an array of layers", arr.display));
                    return Err(());
                };
                let i = match &*ix.index {
                    Expr::Lit(syn::ExprLit {
                        lit: syn::Lit::Int(i),
                        ..
                    }) => i.base10_parse::<usize>().map_err(|_| ())?,
                    other => {
                        self.err(&other, "index arrays of layers with an integer literal");
                        return Err(());
                    }
                };
                if i >= *n {
                    self.err(
                        &ix.index,
                        format!(
                            "index {i} is out of bounds for `{}`, which holds {n} layers",
                            arr.display
                        ),
                    );
                    return Err(());
                }
                let path = &arr.path;
                let idx = proc_macro2::Literal::usize_unsuffixed(i);
                Ok(self.field_value(LayerRef {
                    path: quote!(#path[#idx]),
                    display: format!("{}[{i}]", arr.display),
                    key: kiln_tensor::nn::join(&arr.key, &i.to_string()),
                    kind: (**inner).clone(),
                }))
            }
            Expr::Call(c) => {
                if let Expr::Path(p) = &*c.func {
                    if let Some(name) = p.path.get_ident().map(|i| i.to_string()) {
                        if self.lookup(&name).is_none() {
                            self.err(
                                &c.func,
                                format!("calling a free function (`{name}`) is not supported in model methods: make it a method of this #[model] impl and call `self.{name}(..)`"),
                            );
                            return Err(());
                        }
                    }
                }
                let f = self.lower_expr(&c.func)?;
                match f {
                    Val::Layer(l) => {
                        self.call_layer_args(&l, &c.args.iter().collect::<Vec<_>>(), c)
                    }
                    _ => {
                        self.err(
                            &c.func,
                            "only layers can be called like functions in model methods",
                        );
                        Err(())
                    }
                }
            }
            Expr::MethodCall(mc) => self.lower_method_call(mc),
            Expr::Binary(b) => self.lower_binary(b),
            Expr::Unary(u) => match u.op {
                syn::UnOp::Neg(_) => match self.lower_expr(&u.expr)? {
                    Val::Scalar(s) => Ok(Val::Scalar(-s)),
                    Val::T(n) => self.unary(n, UnaryOp::Neg, u),
                    _ => {
                        self.err(&u, "only tensors and numbers can be negated");
                        Err(())
                    }
                },
                _ => {
                    self.err(&u, "this operator is not supported in model methods");
                    Err(())
                }
            },
            other => {
                self.err(&other, unsupported_expression(other));
                Err(())
            }
        }
    }

    fn field(&self, name: &str) -> Option<&'a ModelField> {
        self.fields.iter().find(|f| f.ident == name)
    }

    fn is_self(e: &Expr) -> bool {
        matches!(e, Expr::Path(p) if p.path.is_ident("self"))
    }

    fn lower_field(&mut self, f: &syn::ExprField) -> LResult<Val> {
        if !Self::is_self(&f.base) {
            self.err(
                &f,
                "only the model's own layers (`self.name`) can be accessed in model methods",
            );
            return Err(());
        }
        let syn::Member::Named(name) = &f.member else {
            self.err(&f.member, "model fields have names");
            return Err(());
        };
        match self.field(&name.to_string()) {
            Some(field) => {
                let field = self.frame.field(name, field.kind.clone());
                Ok(self.field_value(field))
            }
            None => {
                let known: Vec<String> = self.fields.iter().map(|f| f.ident.to_string()).collect();
                self.err(
                    &name,
                    format!(
                        "the model has no layer `{name}`; its layers are {}",
                        known.join(", ")
                    ),
                );
                Err(())
            }
        }
    }

    /// What reading a field gives: a learned tensor's value (its parameter leaf), or
    /// the layer to call.
    fn field_value(&mut self, l: LayerRef) -> Val {
        match &l.kind {
            FieldKind::Param(dims) => {
                let first_read = !self.mg.has_param(&l.key);
                let n = self.mg.learned(&l.path, &l.key, dims);
                if first_read {
                    self.calls.push(Call {
                        key: l.key.clone(),
                        what: format!(
                            "Param<{}>",
                            dims.iter()
                                .map(|d| d.to_string())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                        output: self.shape_str(n),
                        depth: self.nesting,
                        params: Some(dims.iter().product()),
                    });
                }
                Val::T(n)
            }
            _ => Val::Layer(l),
        }
    }
}

/// A layer's parameter count.
pub(crate) fn spec_params(spec: &LayerSpec) -> usize {
    spec.params()
        .iter()
        .map(|p| p.dims.iter().product::<usize>())
        .sum()
}

/// The parameter count of a model with `fields` (nested ones through `defs`).
pub fn model_params(fields: &[ModelField], defs: &Defs) -> usize {
    fn of(kind: &FieldKind, defs: &Defs) -> usize {
        match kind {
            FieldKind::Layer(spec) => spec_params(spec),
            FieldKind::Array(inner, n) => n * of(inner, defs),
            // Its sizes are run-time values: counted when it is built, not here.
            FieldKind::Dynamic(_) => 0,
            FieldKind::Param(dims) => dims.iter().product(),
            FieldKind::Model(path) => defs
                .get(&crate::dsl::model_name(path))
                .map_or(0, |d| model_params(&d.fields, defs)),
        }
    }
    fields.iter().map(|f| of(&f.kind, defs)).sum()
}
