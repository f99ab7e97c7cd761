//! UTF-8 boundaries for byte windows cut out of a stream.

fn is_continuation(b: u8) -> bool {
    b & 0xC0 == 0x80
}

/// Drops up to three leading continuation bytes: a tail must not start inside a code point.
pub fn skip_partial_start(bytes: &[u8]) -> &[u8] {
    let skip = bytes
        .iter()
        .take(3)
        .take_while(|&&b| is_continuation(b))
        .count();
    &bytes[skip..]
}

/// Drops a trailing sequence that is a valid but incomplete code point prefix, so that a
/// consuming read never splits a character that the next chunk will complete.
pub fn trim_partial_end(bytes: &[u8]) -> &[u8] {
    let n = bytes.len();
    for back in 1..=3.min(n) {
        let b = bytes[n - back];
        if is_continuation(b) {
            continue;
        }
        let needed = match b {
            0xC2..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF4 => 4,
            _ => 1,
        };
        if needed > back {
            return &bytes[..n - back];
        }
        return bytes;
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skips_leading_continuations() {
        assert_eq!(skip_partial_start(&[0x82, 0xAC, b'x']), b"x");
        assert_eq!(skip_partial_start(b"abc"), b"abc");
    }

    #[test]
    fn trims_incomplete_end() {
        let euro = "€".as_bytes();
        assert_eq!(trim_partial_end(&euro[..2]), b"");
        assert_eq!(trim_partial_end(euro), euro);
        assert_eq!(trim_partial_end(b"ab\xC3"), b"ab");
        assert_eq!(trim_partial_end(b"ab\xFF"), b"ab\xFF");
    }
}
