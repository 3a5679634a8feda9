//! Seeing a plan: a printout (kernels, what each fuses, bytes each reads and writes,
//! the row pass each belongs to)
//! and a Graphviz DOT export with one cluster per kernel.

use crate::plan::{KernelKind, Plan};
use crate::sym::SDim;
use kiln_tensor::ir::NodeKind;
use kiln_tensor::op::fmt_dims;
use kiln_tensor::{Result, SymDim};
use std::fmt::Write;

impl<D: SymDim> Plan<D> {
    fn node_label(&self, i: usize) -> String {
        match &self.names.get(i).cloned().flatten() {
            Some(n) => n.clone(),
            None => format!("%{i}"),
        }
    }

    fn op_label(&self, i: usize) -> String {
        match &self.graph.nodes[i].kind {
            NodeKind::Leaf(_) => "input".into(),
            NodeKind::RecipDim(d) => format!("1/{d}"),
            NodeKind::Op(op) => op.name().into(),
            NodeKind::Call(k) => format!("call part {k}"),
            NodeKind::CallGrad(k) => format!("backward of part {k}"),
        }
    }

    /// Bytes of one node's value.
    pub fn bytes_of(&self, i: usize) -> D {
        let m = &self.graph.nodes[i].meta;
        m.dims
            .iter()
            .fold(D::lit(m.dtype.size_in_bytes()), |a, d| a.mul(d))
    }

    /// Bytes a kernel reads (each input once) and writes (each output once).
    pub fn kernel_bytes(&self, k: usize) -> (D, D) {
        let kern = &self.kernels[k];
        let sum = |nodes: &[usize]| {
            nodes
                .iter()
                .fold(D::lit(0), |a, &n| a.add(&self.bytes_of(n)))
        };
        if kern.kind == KernelKind::View {
            return (D::lit(0), D::lit(0));
        }
        (sum(&kern.inputs), sum(&kern.outputs))
    }

    /// Total bytes read and written by all kernels.
    pub fn total_bytes(&self) -> (D, D) {
        (0..self.kernels.len()).fold((D::lit(0), D::lit(0)), |(r, w), k| {
            let (kr, kw) = self.kernel_bytes(k);
            (r.add(&kr), w.add(&kw))
        })
    }

    /// A printout: one line per kernel with what it fuses and its memory traffic.
    pub fn report(&self, title: &str) -> String {
        let compute = self
            .kernels
            .iter()
            .filter(|k| k.kind != KernelKind::View)
            .count();
        let ops = self
            .graph
            .nodes
            .iter()
            .filter(|n| matches!(n.kind, NodeKind::Op(_)))
            .count();
        let mut out = format!(
            "{title}: {ops} primitive ops in {compute} kernels (+{} views), {} buffer slots\n",
            self.kernels.len() - compute,
            self.slots.len()
        );
        for (k, kern) in self.kernels.iter().enumerate() {
            if kern.kind == KernelKind::View {
                continue;
            }
            let fused: Vec<String> = kern
                .nodes
                .iter()
                .map(|&n| self.op_label(n))
                .filter(|l| l != "full")
                .collect();
            let ins: Vec<String> = kern.inputs.iter().map(|&i| self.node_label(i)).collect();
            let outs: Vec<String> = kern
                .outputs
                .iter()
                .map(|&o| {
                    format!(
                        "{}{}",
                        self.node_label(o),
                        fmt_dims(&self.graph.nodes[o].meta.dims)
                    )
                })
                .collect();
            let (r, w) = self.kernel_bytes(k);
            let pass = kern
                .row_pass
                .map_or(String::new(), |p| format!(" (row pass {p})"));
            let _ = writeln!(
                out,
                "  k{k:<3} {:<11} [{}] ({}) -> {}  reads {r} B, writes {w} B{pass}",
                kern.kind.name(),
                fused.join(" "),
                ins.join(", "),
                outs.join(", ")
            );
        }
        let (r, w) = self.total_bytes();
        let _ = writeln!(out, "  total: reads {r} B, writes {w} B");
        out
    }

    /// The plan as a Graphviz DOT graph: a cluster per kernel, inputs as boxes.
    pub fn to_dot(&self, title: &str) -> String {
        let mut out = format!(
            "digraph \"{}\" {{\n  rankdir=TB;\n  node [shape=ellipse, fontsize=10];\n",
            title.replace('"', "'")
        );
        out += &self.dot_body("");
        out += "}\n";
        out
    }

    /// Nodes, kernel clusters and edges, node names prefixed by `p`.
    fn dot_body(&self, p: &str) -> String {
        let mut out = String::new();
        for &i in &self.inputs {
            let _ = writeln!(
                out,
                "  {p}n{i} [shape=box, label=\"{}\\n{}\"];",
                self.node_label(i),
                fmt_dims(&self.graph.nodes[i].meta.dims)
            );
        }
        for (k, kern) in self.kernels.iter().enumerate() {
            let _ = writeln!(
                out,
                "  subgraph cluster_{p}{k} {{\n    label=\"k{k} {}\";",
                kern.kind.name()
            );
            for &n in &kern.nodes {
                let shape = if kern.outputs.contains(&n) {
                    ", style=bold"
                } else {
                    ""
                };
                let _ = writeln!(
                    out,
                    "    {p}n{n} [label=\"{}\\n{}\"{shape}];",
                    self.op_label(n),
                    fmt_dims(&self.graph.nodes[n].meta.dims)
                );
            }
            out += "  }\n";
        }
        for (i, node) in self.graph.nodes.iter().enumerate() {
            for &j in &node.inputs {
                let _ = writeln!(out, "  {p}n{j} -> {p}n{i};");
            }
        }
        out
    }
}

/// The reports of several plans given as `(title, plan text)`, one after another.
pub fn report_all(plans: &[(&str, &str)]) -> Result<String> {
    let mut out = String::new();
    for (title, text) in plans {
        out += &Plan::<SDim>::parse(text)?.report(title);
        out.push('\n');
    }
    Ok(out)
}

/// Several plans given as `(title, plan text)` as one DOT graph, a cluster per plan.
pub fn dot_all(plans: &[(&str, &str)]) -> Result<String> {
    let mut out =
        String::from("digraph kiln {\n  rankdir=TB;\n  node [shape=ellipse, fontsize=10];\n");
    for (i, (title, text)) in plans.iter().enumerate() {
        let plan = Plan::<SDim>::parse(text)?;
        let _ = writeln!(
            out,
            "  subgraph cluster_plan{i} {{\n  label=\"{}\";",
            title.replace('"', "'")
        );
        out += &plan.dot_body(&format!("p{i}_"));
        out += "  }\n";
    }
    out += "}\n";
    Ok(out)
}
