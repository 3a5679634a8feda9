//! Build-time fusion: plans a method's graph with `kiln_fusion`, embeds the plan's text
//! as an associated const, compiles each elementwise group whose constants are known
//! into a native Rust loop, and writes the code that runs the plan through the model's
//! `Programs` (fused, or op by op when the model is set unfused).

use crate::graph::{Leaf, MGraph};
use kiln_fusion::{native_exprs, plan_named};
use kiln_tensor::fused::{ExprStep, FusedExpr};
use kiln_tensor::ir::{NodeId, NodeKind};
use proc_macro2::{Literal, TokenStream};
use quote::{format_ident, quote};
use syn::Ident;

/// What the fused path of one method needs.
pub struct Fused {
    /// The associated const holding the plan's text.
    pub plan_const: TokenStream,
    /// What the call needs first (the buffers it reads, the native loops).
    setup: TokenStream,
    /// The program's arguments of `Programs::call`: its number, plan and loops.
    program: TokenStream,
    /// The plan's inputs: the method's arguments and the parameters, as `&RawTensor`s.
    /// The call's context reads `__dev`, `__sizes` (the size parameters) and `__seed`.
    inputs: Vec<TokenStream>,
    /// Whether the plan calls out to dynamic parts (through `__parts`).
    calls_parts: bool,
    /// What binds `__parts`, the dynamic parts the plan calls, placed by the caller
    /// before the run (a training entry reads their gradients after it); empty when
    /// there are none.
    pub parts: TokenStream,
}

impl Fused {
    /// An expression running the plan, fused or op by op (see `Programs::call`), and
    /// evaluating to what `take` (a closure over the iterator of outputs) returns.
    pub fn run(&self, take: TokenStream) -> TokenStream {
        let (setup, program, inputs) = (&self.setup, &self.program, &self.inputs);
        let parts = self.calls_parts.then(|| quote!(.parts(&mut __parts)));
        quote!({
            #setup
            self.__kiln_plans.call(
                #program,
                ::kiln::fusion::RunContext::step(&__dev, __sizes, &__seed)#parts,
                &[#(#inputs),*],
                #take,
            )?
        })
    }
}

/// The native loops of one model's plans, one function per distinct expression (the
/// forward pass's loops recur in the loss and in its training entry), emitted once in
/// a hidden module beside the impl.
pub struct Natives {
    module: Ident,
    /// `(the expression, as its debug form, the loop's name, the loop)`.
    loops: Vec<(String, Ident, TokenStream)>,
}

impl Natives {
    /// No loops yet, for model `model`.
    pub fn new(model: &Ident) -> Self {
        Natives {
            module: format_ident!("__kiln_natives_{}", model),
            loops: Vec::new(),
        }
    }

    /// The path of the loop computing `expr`, written on first use.
    fn path(&mut self, expr: &FusedExpr) -> TokenStream {
        let key = format!("{expr:?}");
        let name = match self.loops.iter().find(|(k, _, _)| *k == key) {
            Some((_, name, _)) => name.clone(),
            None => {
                let name = format_ident!("loop_{}", self.loops.len());
                let f = native_fn(&name, expr);
                self.loops.push((key, name.clone(), f));
                name
            }
        };
        let module = &self.module;
        quote!(#module::#name)
    }

    /// The module holding every loop.
    pub fn module(&self) -> TokenStream {
        let module = &self.module;
        let loops = self.loops.iter().map(|(_, _, f)| f);
        quote! {
            #[doc(hidden)]
            #[allow(non_snake_case)]
            mod #module {
                #[allow(unused_imports)]
                use ::kiln::tensor::fused::{binary_f32, compare_f32, select_f32, to_bool_f32, unary_f32};
                #[allow(unused_imports)]
                use ::kiln::tensor::{BinaryOp, CmpOp, UnaryOp};
                #(#loops)*
            }
        }
    }
}

/// Plans `outputs` of `mg` as program `id` of its model (a `training` entry's, or an
/// evaluation method's); the native loops go to `natives`.
pub fn fuse(
    mg: &MGraph,
    outputs: &[NodeId],
    id: usize,
    const_name: &Ident,
    natives_of_model: &mut Natives,
    training: bool,
) -> Fused {
    let live = mg.g.live(outputs);
    let leaves: Vec<NodeId> = (0..mg.g.nodes.len())
        .filter(|&i| live[i] && matches!(mg.g.nodes[i].kind, NodeKind::Leaf(_)))
        .collect();
    let plan = plan_named(&mg.g, &leaves, outputs, &mg.names, &mg.layers);
    let text = plan.to_text();
    let plan_const = quote! {
        #[doc(hidden)]
        pub const #const_name: &'static str = #text;
    };

    // Only the kernels that have a compiled loop are listed, by position (`2k`, `2k + 1`).
    let mut natives = Vec::new();
    let mut at = 0u32;
    for k in 0..plan.kernels.len() {
        for e in native_exprs(&plan, k) {
            if let Some(expr) = e {
                let f = natives_of_model.path(&expr);
                let at = Literal::u32_unsuffixed(at);
                natives.push(quote!((#at, #f)));
            }
            at += 1;
        }
    }
    let mut buffers = Vec::new();
    let leaf_exprs: Vec<TokenStream> = leaves
        .iter()
        .map(|&n| {
            let NodeKind::Leaf(k) = mg.g.nodes[n].kind else {
                unreachable!("leaves only")
            };
            match &mg.leaves[k] {
                Leaf::Input(name) => quote!(#name),
                Leaf::Param { layer, field, .. } => quote!(#layer.#field.raw()),
                Leaf::Buffer { layer, field, .. } => {
                    let b = format_ident!("__kiln_buffer{}", buffers.len());
                    buffers.push(quote!(let #b = #layer.#field.get().into_raw();));
                    quote!(&#b)
                }
            }
        })
        .collect();
    let id = Literal::usize_unsuffixed(id);
    // The dynamic parts the plan calls out to, in its call order.
    let parts = if mg.parts.is_empty() {
        quote!()
    } else {
        let mode = if training {
            quote!(::kiln::tensor::nn::Mode::Train {
                seed: __seed.on_host("a dynamic part")?
            })
        } else {
            quote!(::kiln::tensor::nn::Mode::Eval)
        };
        let sites = mg.parts.iter().map(|p| {
            let (path, display) = (&p.path, &p.display);
            quote!((&#path as &dyn ::kiln::dynamic::PartForward<Be>, #display))
        });
        quote! {
            let mut __parts = ::kiln::dynamic::PartCalls::new(#mode, ::std::vec![#(#sites),*]);
        }
    };
    let setup = quote! {
        #(#buffers)*
        const __KILN_NATIVES: &::kiln::fusion::Natives = &[#(#natives),*];
    };
    let program = quote!(#id, Self::#const_name, __KILN_NATIVES);
    Fused {
        plan_const,
        setup,
        program,
        inputs: leaf_exprs,
        calls_parts: !mg.parts.is_empty(),
        parts,
    }
}

/// A native loop for `expr`: every step a local, the ops as the shared inline f32
/// functions (their `match` folds away), so rustc sees one straight-line loop body.
fn native_fn(name: &Ident, expr: &FusedExpr) -> TokenStream {
    let ins: Vec<Ident> = (0..expr.inputs).map(|i| format_ident!("i{}", i)).collect();
    let idx: Vec<Literal> = (0..expr.inputs).map(Literal::usize_unsuffixed).collect();
    let r = |i: usize| format_ident!("r{}", i);
    let steps: Vec<TokenStream> = expr
        .steps
        .iter()
        .enumerate()
        .map(|(s, step)| {
            let v = r(s);
            let e = match *step {
                ExprStep::Input(k) => {
                    let i = &ins[k];
                    quote!(#i[j])
                }
                // Plans have one output per kernel: an epilogue reads it in place.
                ExprStep::Output(_) => quote!(out[j]),
                ExprStep::Const(c) => {
                    let bits = Literal::u32_suffixed(c.to_bits());
                    quote!(f32::from_bits(#bits))
                }
                ExprStep::Unary(op, a) => {
                    let (op, a) = (format_ident!("{}", format!("{op:?}")), r(a));
                    quote!(unary_f32(UnaryOp::#op, #a))
                }
                ExprStep::Binary(op, a, b) => {
                    let (op, a, b) = (format_ident!("{}", format!("{op:?}")), r(a), r(b));
                    quote!(binary_f32(BinaryOp::#op, #a, #b))
                }
                ExprStep::Compare(op, a, b) => {
                    let (op, a, b) = (format_ident!("{}", format!("{op:?}")), r(a), r(b));
                    quote!(compare_f32(CmpOp::#op, #a, #b))
                }
                ExprStep::Select(c, a, b) => {
                    let (c, a, b) = (r(c), r(a), r(b));
                    quote!(select_f32(#c, #a, #b))
                }
                ExprStep::ToBool(a) => {
                    let a = r(a);
                    quote!(to_bool_f32(#a))
                }
            };
            quote!(let #v = #e;)
        })
        .collect();
    let result = r(expr.results[0]);
    quote! {
        #[allow(clippy::all, unused_variables)]
        #[inline]
        pub(super) fn #name(ins: &[&[f32]], outs: &mut [&mut [f32]]) {
            // Inlined into both copies `wide` compiles (baseline, and AVX2 where the
            // CPU has it).
            #[inline(always)]
            fn body(ins: &[&[f32]], outs: &mut [&mut [f32]]) {
                let n = outs[0].len();
                #(let #ins = &ins[#idx][..n];)*
                let out = &mut outs[0][..n];
                for j in 0..n {
                    #(#steps)*
                    out[j] = #result;
                }
            }
            ::kiln::tensor::simd::wide(#[inline(always)] || body(ins, outs))
        }
    }
}
