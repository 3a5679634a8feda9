//! Run-time errors of a kernel worded as the model's mistake: an index a gather found
//! out of range is a token id too large for an embedding, or a label outside the
//! classes of `cross_entropy`, and the message names which (the kernel only knows it
//! gathered).

use crate::plan::Plan;
use crate::sym::SDim;
use kiln_tensor::ir::NodeKind;
use kiln_tensor::{Error, Op, SymDim};

/// `e` reworded where it is a gather's index out of range and the plan says what that
/// gather reads: the layer an embedding's rows belong to, or cross-entropy's labels.
/// Any other error comes back as it was.
pub(crate) fn name_index_error(plan: &Plan<SDim>, e: Error) -> Error {
    let Some((index, bound)) = e.gather_index_out_of_range() else {
        return e;
    };
    let mut said: Vec<(&'static str, String)> = Vec::new();
    for (i, node) in plan.graph.nodes.iter().enumerate() {
        let NodeKind::Op(Op::Gather { axis }) = node.kind else {
            continue;
        };
        let Some(&x) = node.inputs.first() else {
            continue;
        };
        let dims = &plan.graph.nodes[x].meta.dims;
        let Some(size) = dims.get(axis) else {
            continue;
        };
        // A size the plan leaves to run time may be this one.
        if size.as_lit().is_some_and(|n| n != bound) {
            continue;
        }
        let what = match (axis, dims.len()) {
            // An embedding reads rows of its table [V, D].
            (0, 2) => ("embedding", match plan.layers.get(i).and_then(Option::as_ref) {
                Some(key) => format!(
                    "token id {index} is out of range for the embedding `{key}`, of {bound} rows: its ids are 0..{bound}"
                ),
                None => format!(
                    "token id {index} is out of range for an embedding of {bound} rows: its ids are 0..{bound}"
                ),
            }),
            // Cross-entropy picks each row's label from log-probabilities [N, C].
            (1, 2) => (
                "cross_entropy",
                format!(
                    "label {index} is out of range for `cross_entropy` over {bound} classes: labels are class ids 0..{bound}"
                ),
            ),
            _ => continue,
        };
        if !said.contains(&what) {
            said.push(what);
        }
    }
    match said.len() {
        0 => e,
        1 => Error::invalid(said[0].0, said.remove(0).1),
        // Two readers of one size: either may have been given it.
        _ => {
            let all: Vec<String> = said.into_iter().map(|(_, w)| w).collect();
            Error::invalid("gather", all.join("; or "))
        }
    }
}
