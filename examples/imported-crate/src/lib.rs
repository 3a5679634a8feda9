//! A model trained in PyTorch, shipped as a Kiln crate. The build script imports
//! `model/decoder.onnx` into `#[model]` source and a checkpoint; this crate includes
//! the source, so `Decoder` is a model like a hand-written one (a caller's wrong shape
//! is a `cargo check` error), builds the checkpoint in with `kiln::embed!` (checked
//! against `Decoder` when the crate compiles), and fine-tunes it as a part of
//! [`NextToken`], a model with a loss.

use kiln::tensor::Backend;

include!(concat!(env!("OUT_DIR"), "/decoder.rs"));

/// The imported decoder with a next-token loss, for fine-tuning.
#[model]
pub struct NextToken {
    /// The imported model; load its checkpoint into this field.
    pub net: Decoder,
}

#[model]
impl NextToken {
    /// Mean cross-entropy of the decoder's logits at each position against `next`,
    /// the token after it (`[B·T]`).
    pub fn loss<const B: usize, const T: usize>(
        &self,
        tokens: Tensor<B, T, i32>,
        next: Tensor<Dyn, i32>,
    ) -> Tensor {
        self.net
            .forward(tokens)
            .reshape::<Dyn, 20>()
            .cross_entropy(next)
    }
}

/// The imported weights, built into the program and checked against [`Decoder`] when
/// it compiled.
pub fn shipped<B: Backend>(device: &B::Device) -> kiln::Result<Decoder<B>> {
    kiln::embed!(Decoder, concat!(env!("OUT_DIR"), "/decoder.safetensors")).load::<B>(device)
}

/// Where the build script wrote the imported checkpoint.
pub const CHECKPOINT: &str = concat!(env!("OUT_DIR"), "/decoder.safetensors");

/// The same decoder imported from a copy whose file name, producer and graph input and
/// output names are hostile text (newlines, comment ends, quotes, line separators,
/// escape codes: build.rs): the generated source compiles to the same model, every
/// such name escaped in its comments.
pub mod hostile {
    include!(concat!(env!("OUT_DIR"), "/hostile.rs"));
}
