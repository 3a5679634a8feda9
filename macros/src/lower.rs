//! Lowering a method body: every expression becomes nodes of the graph, built by the
//! op table's rules on symbolic dims; a refusal is reported on the exact
//! sub-expression, naming both shapes.

use crate::dsl::{parse_tensor_type, FieldKind, TensorTy};
use crate::graph::MGraph;
use crate::structs::ModelField;
use kiln_fusion::SDim;
use kiln_tensor::ir::NodeId;
use kiln_tensor::nn::{LayerSpec, Mode};
use kiln_tensor::op::fmt_dims;
use kiln_tensor::{
    BinaryOp, BuilderExt, DType, Error, Form, Guard, Method, MethodArgs, Precision, SymDim,
    TensorMeta, UnaryOp,
};
use proc_macro2::TokenStream;
use quote::{format_ident, quote, ToTokens};
use std::collections::HashMap;
use syn::spanned::Spanned;
use syn::{Expr, FnArg, GenericParam, Ident, ImplItemFn, Pat, ReturnType, Stmt, Type};

/// The last statement of a method's body, or its braces when it is empty: where a
/// result mismatch is reported.
struct FinalExpr<'m>(&'m MethodSig);

impl ToTokens for FinalExpr<'_> {
    fn to_tokens(&self, tokens: &mut TokenStream) {
        let b = &self.0.item.block;
        match b.stmts.last() {
            Some(s) => s.to_tokens(tokens),
            None => b.to_tokens(tokens),
        }
    }
}

/// A method of the `#[model] impl`, with its signature parsed.
#[derive(Clone)]
pub struct MethodSig {
    /// The method as written.
    pub item: ImplItemFn,
    /// Its const generic parameters.
    pub consts: Vec<Ident>,
    /// Its tensor arguments.
    pub args: Vec<(Ident, TensorTy)>,
    /// Its result (one tensor, or the elements of a tuple).
    pub ret: Vec<TensorTy>,
    /// Whether the result is a tuple.
    pub ret_tuple: bool,
}

impl MethodSig {
    /// The method's name.
    pub fn name(&self) -> &Ident {
        &self.item.sig.ident
    }

    /// Whether it returns one scalar (then it gets a `_and_grad` twin).
    pub fn is_scalar_loss(&self) -> bool {
        !self.ret_tuple
            && self.ret.len() == 1
            && self.ret[0].dims.is_empty()
            && self.ret[0].dtype.is_float()
    }
}

/// Parses a method's signature: `&self`, const generics, tensor arguments and result.
pub fn parse_method(item: &ImplItemFn) -> syn::Result<MethodSig> {
    let sig = &item.sig;
    let mut consts = Vec::new();
    for p in &sig.generics.params {
        match p {
            GenericParam::Const(c) => consts.push(c.ident.clone()),
            other => {
                return Err(syn::Error::new(
                    other.span(),
                    "model methods take only const generic parameters (`const B: usize`); the backend is `Be`",
                ))
            }
        }
    }
    let mut inputs = sig.inputs.iter();
    match inputs.next() {
        Some(FnArg::Receiver(r)) if r.reference.is_some() && r.mutability.is_none() => {}
        _ => {
            return Err(syn::Error::new(
                sig.span(),
                "model methods take `&self` first",
            ))
        }
    }
    let mut args = Vec::new();
    for a in inputs {
        let FnArg::Typed(pt) = a else {
            unreachable!("only the first argument can be self")
        };
        let Pat::Ident(pi) = &*pt.pat else {
            return Err(syn::Error::new(
                pt.pat.span(),
                "name each argument with a plain identifier",
            ));
        };
        let ty = parse_tensor_type(&pt.ty, &consts)?.ok_or_else(|| {
            syn::Error::new(
                pt.ty.span(),
                "model method arguments are tensors: `Tensor<B, 784>`",
            )
        })?;
        args.push((pi.ident.clone(), ty));
    }
    let (ret, ret_tuple) = match &sig.output {
        ReturnType::Default => {
            return Err(syn::Error::new(
                sig.span(),
                "a model method returns a tensor (or a tuple of tensors)",
            ))
        }
        ReturnType::Type(_, t) => match &**t {
            Type::Tuple(tt) => {
                let r = tt
                    .elems
                    .iter()
                    .map(|e| {
                        parse_tensor_type(e, &consts)?
                            .ok_or_else(|| syn::Error::new(e.span(), "expected a tensor type"))
                    })
                    .collect::<syn::Result<Vec<_>>>()?;
                (r, true)
            }
            t => (
                vec![parse_tensor_type(t, &consts)?.ok_or_else(|| {
                    syn::Error::new(t.span(), "expected a tensor type like `Tensor<B, 10>`")
                })?],
                false,
            ),
        },
    };
    Ok(MethodSig {
        item: item.clone(),
        consts,
        args,
        ret,
        ret_tuple,
    })
}

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

/// A nested model's definition, as its `#[model]` impl handed it over.
pub struct ModelDef {
    /// Its fields.
    pub fields: Vec<ModelField>,
    /// Its methods.
    pub methods: Vec<MethodSig>,
    /// Whether its own expansion reported mistakes (calls into it then report none).
    pub broken: bool,
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

/// The nested models' definitions, by name (the last segment of their path).
pub type Defs = HashMap<String, ModelDef>;

/// Where `self` of the body being lowered is, seen from the top model.
#[derive(Clone)]
struct Frame {
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

type LResult<T> = Result<T, ()>;

/// Source-like text of an expression for messages: `self.fc1(x)`, not `self . fc1 (x)`.
fn src(e: &impl ToTokens) -> String {
    let mut s = e.to_token_stream().to_string();
    for (from, to) in [
        (" . ", "."),
        (" (", "("),
        ("( ", "("),
        (" )", ")"),
        (" ,", ","),
        (" :: ", "::"),
        (" [", "["),
        ("[ ", "["),
        (" ]", "]"),
        ("& ", "&"),
        (" ?", "?"),
        (" < ", "<"),
        ("< ", "<"),
        (" >", ">"),
        ("! (", "!("),
    ] {
        s = s.replace(from, to);
    }
    s
}

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

    fn call_layer_args(
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
    fn call_layer(
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
        for p in spec.params() {
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
        let out = match spec.forward(&mut self.mg, &refs, &xn, mode) {
            Ok(o) => o,
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

    fn lower_method_call(&mut self, mc: &syn::ExprMethodCall) -> LResult<Val> {
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

    /// `self.router.forward::<B, 64>(h)`: a call out to a dynamic part, which the plan
    /// runs when it gets there; the declared dims and dtype are what the rest of the
    /// method sees, and what the part's output is checked against at run time.
    fn call_dynamic(&mut self, l: &LayerRef, mc: &syn::ExprMethodCall) -> LResult<Val> {
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
    fn positions(&mut self, l: &LayerRef, vocab: usize, mc: &syn::ExprMethodCall) -> LResult<Val> {
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
    fn attend(&mut self, l: &LayerRef, spec: LayerSpec, mc: &syn::ExprMethodCall) -> LResult<Val> {
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
        let weight = spec
            .params()
            .into_iter()
            .next()
            .expect("an embedding has its table");
        let w = self.mg.param(&l.path, &l.key, &weight, false);
        let y = self.mg.tied_scores(&h, &w);
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

    /// Lowers call arguments in the caller's frame: each value with its expression.
    fn lower_args<'e>(
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
    fn call_model(
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
        let name = crate::sizes::display_name(&key);
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
        let r = self.inline_call(m, &format!("{}.{method}", l.display), args, span);
        self.nesting -= 1;
        (self.fields, self.methods, self.frame) = saved;
        if let Ok(Val::T(y)) = &r {
            self.calls[at].output = self.shape_str(*y);
        }
        r
    }

    /// Inlines a call of `m` (messages name it `callee`) with `args` lowered by the
    /// caller, checking them against its signature.
    fn inline_call(
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

    fn unary(&mut self, n: NodeId, op: UnaryOp, span: &dyn ToTokens) -> LResult<Val> {
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
    fn tensor_method(&mut self, n: NodeId, mc: &syn::ExprMethodCall) -> LResult<Val> {
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

    fn lower_binary(&mut self, b: &syn::ExprBinary) -> LResult<Val> {
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
            (Val::T(a), Val::T(bn)) => match self.mg.binary(op, &a, &bn) {
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

    fn scalar_result(
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
    fn axis_arg(&mut self, mc: &syn::ExprMethodCall) -> LResult<Option<usize>> {
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

    fn const_usize(&mut self, a: &syn::GenericArgument) -> LResult<usize> {
        if let syn::GenericArgument::Const(e) = a {
            match crate::sizes::const_int(e) {
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
    fn reshape_dim_arg(&mut self, a: &syn::GenericArgument) -> LResult<Option<SDim>> {
        match a {
            syn::GenericArgument::Type(Type::Path(p)) if p.path.is_ident("Dyn") => Ok(None),
            _ => self.dim_arg(a).map(Some),
        }
    }

    fn dim_arg(&mut self, a: &syn::GenericArgument) -> LResult<SDim> {
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

/// A kiln error as the macro shows it.
pub fn describe(e: &Error) -> String {
    e.to_string()
}

/// A library rule's refusal, as the macro reports it: what kind of mistake, in which
/// op, of which operands (as the user wrote them), then the rule's own words.
fn refusal(op: &str, operands: &[String], e: &Error) -> String {
    let kind = match e {
        Error::Shape { .. } => "shape mismatch",
        Error::DType { .. } => "dtype mismatch",
        _ => "invalid argument",
    };
    let names: Vec<String> = operands.iter().map(|o| format!("`{o}`")).collect();
    format!(
        "{kind} in `{op}` of {}: {}",
        names.join(" and "),
        describe_inner(e)
    )
}

fn describe_inner(e: &Error) -> String {
    match e {
        Error::Shape { msg, .. } | Error::DType { msg, .. } | Error::Invalid { msg, .. } => {
            msg.clone()
        }
        other => other.to_string(),
    }
}

/// Why an expression cannot be in a model method, and what to write instead.
fn unsupported_expression(e: &Expr) -> String {
    let fixed = "a model method is one graph, fixed at build time";
    match e {
        Expr::If(_) | Expr::Match(_) => format!(
            "`{}` is not supported in model methods ({fixed}): compute with tensor ops, or branch in plain Rust around the calls",
            if matches!(e, Expr::If(_)) { "if" } else { "match" }
        ),
        Expr::While(_) | Expr::Loop(_) => format!(
            "`while` and `loop` are not supported in model methods ({fixed}): loop over an array of layers with `for layer in &self.blocks {{ .. }}`"
        ),
        Expr::Try(_) => "`?` is not needed in model methods: the generated method returns a `Result` and passes every error on; remove the `?`".into(),
        Expr::Return(r) => match &r.expr {
            Some(v) => format!(
                "`return` is not supported in model methods: end the body with the value, `{}`, as its last expression",
                src(v)
            ),
            None => "`return` is not supported in model methods: end the body with the value it returns".into(),
        },
        Expr::Closure(_) => "closures are not supported in model methods: write a method of this #[model] impl".into(),
        Expr::Macro(m) => format!(
            "macros (`{}!`) are not supported in model methods",
            src(&m.mac.path)
        ),
        Expr::Reference(_) => "`&` is not needed in model methods: pass tensors by name".into(),
        _ => "this expression is not supported in model methods; see the kiln-macros docs for what bodies may hold".into(),
    }
}

/// A layer's parameter count.
fn spec_params(spec: &LayerSpec) -> usize {
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
