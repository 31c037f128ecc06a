// An output embedding as every input gives it (OTLP span attribute, `POST /api/v1/embeddings`):
// 1 to `MAX_DIMS` finite numbers within the f32 range, not all zero, checked once, here; the
// dimension each model keeps (shared by the inputs and the alert engine), and one embedding as
// the engine takes it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Most dimensions an embedding may have.
pub const MAX_DIMS: usize = 4096;

/// Why an embedding is refused; the index is the offending element's.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EmbeddingError {
    #[error("must have 1 to {MAX_DIMS} dimensions, has {0}")]
    Dimensions(usize),
    #[error("element {0} is not a finite number")]
    NotFinite(usize),
    #[error("element {0} is outside the 32-bit float range")]
    OutOfRange(usize),
    #[error("is all zeros (a zero vector has no direction)")]
    Zero,
}

/// Checks an embedding (1..=`MAX_DIMS` finite numbers within f32 range, not all zero) and
/// converts it to f32.
pub fn check_embedding(values: &[f64]) -> Result<Vec<f32>, EmbeddingError> {
    if values.is_empty() || values.len() > MAX_DIMS {
        return Err(EmbeddingError::Dimensions(values.len()));
    }
    let mut out = Vec::with_capacity(values.len());
    for (i, x) in values.iter().enumerate() {
        if !x.is_finite() {
            return Err(EmbeddingError::NotFinite(i));
        }
        let f = *x as f32;
        if !f.is_finite() {
            return Err(EmbeddingError::OutOfRange(i));
        }
        out.push(f);
    }
    if out.iter().all(|x| *x == 0.0) {
        return Err(EmbeddingError::Zero);
    }
    Ok(out)
}

/// One output embedding of a model at a time, as the alert engine takes it.
#[derive(Debug, Clone, PartialEq)]
pub struct EmbeddingInput {
    pub model: String,
    pub at_ms: i64,
    pub vector: Arc<[f32]>,
}

/// A model's embedding dimension may change after it sent none for this long.
const DIM_IDLE_RESET_MS: i64 = 3_600_000;
/// Most models whose embedding dimension is remembered (and so whose embeddings are kept).
pub const MAX_EMBEDDING_MODELS: usize = 1_000;

/// Why a model's embedding was refused by [`EmbeddingDims`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DimError {
    #[error("has {got} dimensions but this model's embeddings have {expected}")]
    Mismatch { got: usize, expected: usize },
    #[error("embeddings of more than {MAX_EMBEDDING_MODELS} models are being tracked")]
    TooManyModels,
}

/// The embedding dimension of each model, shared by the API and the engine's record sink: the
/// first embedding sets it; another is refused until the model sent none for an hour.
#[derive(Default)]
pub struct EmbeddingDims {
    inner: Mutex<HashMap<String, (usize, i64)>>,
}

impl EmbeddingDims {
    pub fn admit(&self, model: &str, dim: usize, now: i64) -> Result<(), DimError> {
        let mut m = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((d, last)) = m.get_mut(model) {
            if *d != dim && now - *last < DIM_IDLE_RESET_MS {
                return Err(DimError::Mismatch {
                    got: dim,
                    expected: *d,
                });
            }
            *d = dim;
            *last = (*last).max(now);
            return Ok(());
        }
        if m.len() >= MAX_EMBEDDING_MODELS {
            m.retain(|_, (_, last)| now - *last < DIM_IDLE_RESET_MS);
            if m.len() >= MAX_EMBEDDING_MODELS {
                return Err(DimError::TooManyModels);
            }
        }
        m.insert(model.to_string(), (dim, now));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embeddings_are_checked_and_converted() {
        assert_eq!(check_embedding(&[0.5, -2.0]).unwrap(), vec![0.5f32, -2.0]);
        assert_eq!(check_embedding(&[]), Err(EmbeddingError::Dimensions(0)));
        assert_eq!(
            check_embedding(&vec![1.0; MAX_DIMS + 1]),
            Err(EmbeddingError::Dimensions(MAX_DIMS + 1))
        );
        assert!(check_embedding(&vec![1.0; MAX_DIMS]).is_ok());
        assert_eq!(
            check_embedding(&[1.0, f64::NAN]),
            Err(EmbeddingError::NotFinite(1))
        );
        assert_eq!(
            check_embedding(&[f64::INFINITY]),
            Err(EmbeddingError::NotFinite(0))
        );
        assert_eq!(
            check_embedding(&[1.0, 1e39]),
            Err(EmbeddingError::OutOfRange(1))
        );
        assert_eq!(check_embedding(&[0.0, 0.0]), Err(EmbeddingError::Zero));
    }

    #[test]
    fn dimensions_are_fixed_per_model_until_it_goes_quiet() {
        let d = EmbeddingDims::default();
        assert_eq!(d.admit("a", 384, 0), Ok(()));
        assert_eq!(d.admit("b", 768, 0), Ok(()));
        assert_eq!(d.admit("a", 384, 10), Ok(()));
        assert_eq!(
            d.admit("a", 768, 20),
            Err(DimError::Mismatch {
                got: 768,
                expected: 384
            })
        );
        // An hour without embeddings: the model may switch its embedding model.
        assert_eq!(d.admit("a", 768, 10 + DIM_IDLE_RESET_MS), Ok(()));
        assert!(d.admit("a", 384, 20 + DIM_IDLE_RESET_MS).is_err());
    }
}
