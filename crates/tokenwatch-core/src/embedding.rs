// An output embedding as every input gives it (OTLP span attribute, `POST /api/v1/embeddings`):
// 1 to `MAX_DIMS` finite numbers within the f32 range, not all zero, checked once, here.

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
}
