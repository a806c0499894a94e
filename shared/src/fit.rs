//! Fitting a result into a message: a result whose encoding is larger than the server takes
//! is cut (its largest texts first, each halved until the whole fits) and marked
//! `truncated`, so that it can always be published. JSON may escape one byte of output into
//! six (`\u0001`), so a command within its output limit can still make an oversized result.

use crate::codec::{self, Encoding};
use crate::ActionResult;

/// Room left for headers and framing beside the payload.
pub const HEADROOM: usize = 4 * 1024;

/// What [`fit`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fitted {
    /// It fitted as it was.
    AsIs,
    /// Texts were cut; `truncated` is set.
    Cut,
}

/// Cuts the result's texts until its encoding is at most `max_bytes`. Fails only when even
/// with every text empty it does not fit (ids and reasons alone are that large).
pub fn fit(
    result: &mut ActionResult,
    encoding: Encoding,
    max_bytes: usize,
) -> Result<Fitted, codec::CodecError> {
    let limit = max_bytes.saturating_sub(HEADROOM);
    let body_len = result.http.as_ref().map(|h| h.body.len());
    let mut cut = false;
    // Each pass halves the largest text: a few dozen passes at most.
    for _ in 0..128 {
        let size = codec::encode(result, encoding)?.len();
        if size <= limit {
            if cut {
                result.truncated = true;
                if let Some(h) = result.http.as_mut() {
                    h.truncated |= Some(h.body.len()) != body_len;
                }
            }
            return Ok(if cut { Fitted::Cut } else { Fitted::AsIs });
        }
        let over = size - limit;
        let text_len = result.stdout.len()
            + result.stderr.len()
            + result.http.as_ref().map_or(0, |h| h.body.len());
        // Encoded bytes per text byte, about (six for control bytes in JSON).
        let ratio = (size as f64 / text_len.max(1) as f64).max(1.0);
        let mut texts = vec![&mut result.stdout, &mut result.stderr];
        if let Some(h) = result.http.as_mut() {
            texts.push(&mut h.body);
        }
        let Some(largest) = texts.into_iter().max_by_key(|t| t.len()) else {
            break;
        };
        if largest.is_empty() {
            break;
        }
        // Cut what is over, in text bytes, but at most half of this text per pass.
        let cut_by = ((over as f64 / ratio).ceil() as usize).max(1);
        let keep = largest.len().saturating_sub(cut_by).max(largest.len() / 2);
        let mut at = keep;
        while !largest.is_char_boundary(at) {
            at -= 1;
        }
        largest.truncate(at);
        cut = true;
    }
    // Last resort: every text emptied.
    result.stdout.clear();
    result.stderr.clear();
    if let Some(h) = result.http.as_mut() {
        h.body.clear();
        h.truncated = true;
    }
    result.truncated = true;
    if codec::encode(result, encoding)?.len() <= limit {
        Ok(Fitted::Cut)
    } else {
        Err(codec::CodecError::TooLarge(max_bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ActionId, JobId, Outcome};

    fn result(stdout: String, stderr: String) -> ActionResult {
        let mut r = ActionResult::new(
            ActionId::new("a1").unwrap(),
            JobId::new("j").unwrap(),
            Outcome::Completed { exit_code: 0 },
            1,
        );
        r.stdout = stdout;
        r.stderr = stderr;
        r
    }

    #[test]
    fn control_bytes_that_json_escapes_sixfold_are_cut_to_fit() {
        let mib = "\u{1}".repeat(1 << 20);
        for enc in [Encoding::Json, Encoding::Msgpack] {
            let mut r = result(mib.clone(), mib.clone());
            let limit = 1 << 20;
            let fitted = fit(&mut r, enc, limit).unwrap();
            assert_eq!(fitted, Fitted::Cut, "{enc:?}");
            assert!(r.truncated);
            let size = codec::encode(&r, enc).unwrap().len();
            assert!(size <= limit - HEADROOM, "{enc:?}: {size}");
            // What is kept is a prefix, and not needlessly little.
            assert!(mib.starts_with(&r.stdout));
            assert!(size > limit / 4, "{enc:?}: kept only {size} bytes");
        }
    }

    #[test]
    fn a_result_that_fits_is_untouched_and_multibyte_text_is_cut_on_a_boundary() {
        let mut r = result("ok\n".into(), String::new());
        assert_eq!(fit(&mut r, Encoding::Json, 8 << 20).unwrap(), Fitted::AsIs);
        assert!(!r.truncated);
        let mut r = result("é".repeat(300_000), String::new());
        assert_eq!(
            fit(&mut r, Encoding::Msgpack, 64 * 1024).unwrap(),
            Fitted::Cut
        );
        assert!(r.stdout.chars().all(|c| c == 'é'));
    }
}
