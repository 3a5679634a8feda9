//! [`TextWindows`]: a text as windows of tokens for next-token prediction, bytes of a
//! file (a vocabulary of 256) or token ids a user's tokenizer made.

use crate::dataset::{check_index, Dataset, Example, Field};
use kiln_tensor::{Error, Result};
use std::path::Path;

/// The largest text file [`TextWindows::bytes_of`] reads (1 GiB: 4 GiB of tokens).
pub const MAX_TEXT_BYTES: u64 = 1 << 30;

/// Windows of a token sequence: example `i` is the `context` tokens from `i · stride`
/// as the input and the same window one token later as the target, both `i32`, dims
/// `[context]`.
#[derive(Clone, Debug)]
pub struct TextWindows {
    tokens: Vec<i32>,
    vocab: usize,
    context: usize,
    stride: usize,
}

impl TextWindows {
    /// The bytes of the file at `path` as tokens (vocabulary 256); a file over
    /// [`MAX_TEXT_BYTES`] is refused from its size, unread.
    pub fn bytes_of(path: impl AsRef<Path>, context: usize, stride: usize) -> Result<Self> {
        let path = path.as_ref();
        let bad = |why: String| Error::Format(format!("{}: {why}", path.display()));
        let file = std::fs::File::open(path).map_err(|e| bad(format!("cannot read it: {e}")))?;
        let size = file
            .metadata()
            .map_err(|e| bad(format!("cannot read it: {e}")))?
            .len();
        if size > MAX_TEXT_BYTES {
            return Err(bad(format!(
                "it holds {size} bytes, more than the {MAX_TEXT_BYTES} read here (a token \
                 each, as i32); tokenize it yourself and give the ids to TextWindows::new"
            )));
        }
        let mut bytes = Vec::with_capacity(size as usize);
        // Through the limit too: a file that grows, or a stream, stops there.
        std::io::Read::read_to_end(
            &mut std::io::Read::take(file, MAX_TEXT_BYTES + 1),
            &mut bytes,
        )
        .map_err(|e| bad(format!("cannot read it: {e}")))?;
        if bytes.len() as u64 > MAX_TEXT_BYTES {
            return Err(bad(format!(
                "it is longer than the {MAX_TEXT_BYTES} bytes read here"
            )));
        }
        let tokens = bytes.into_iter().map(i32::from).collect();
        Self::new(tokens, 256, context, stride)
            .map_err(|e| e.with_context(&format!("reading {}", path.display())))
    }

    /// Windows over `tokens`, each below `vocab`: an error naming the first token out
    /// of range, or when the sequence is shorter than one window and its next token.
    pub fn new(tokens: Vec<i32>, vocab: usize, context: usize, stride: usize) -> Result<Self> {
        const OP: &str = "TextWindows";
        if context == 0 || stride == 0 {
            return Err(Error::invalid(
                OP,
                format!("context ({context}) and stride ({stride}) must be at least 1"),
            ));
        }
        if let Some((at, t)) = tokens
            .iter()
            .enumerate()
            .find(|(_, &t)| t < 0 || t as usize >= vocab)
        {
            return Err(Error::invalid(
                OP,
                format!("token {at} is {t}, outside the vocabulary of {vocab}"),
            ));
        }
        if tokens.len() <= context {
            return Err(Error::invalid(
                OP,
                format!(
                    "{} tokens are too few for a window of {context} and its next token",
                    tokens.len()
                ),
            ));
        }
        Ok(TextWindows {
            tokens,
            vocab,
            context,
            stride,
        })
    }

    /// The vocabulary's size.
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// Tokens per window.
    pub fn context(&self) -> usize {
        self.context
    }
}

impl Dataset for TextWindows {
    fn len(&self) -> usize {
        (self.tokens.len() - self.context - 1) / self.stride + 1
    }

    fn get(&self, index: usize) -> Result<Example> {
        check_index("TextWindows", index, self.len())?;
        let at = index * self.stride;
        let window = |from: usize| self.tokens[from..from + self.context].to_vec();
        Ok(Example {
            input: Field::tokens(window(at)),
            target: Field::tokens(window(at + 1)),
        })
    }
}
