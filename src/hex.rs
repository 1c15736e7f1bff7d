//! Lower-case hex, as the gateway writes a SHA-256: a key's (`tollgate key`, the consumers file),
//! a client certificate's (`tls:fingerprint`, `cert_sha256`). Its own module, below `tls` and
//! `consumers`, because both write it.

/// `bytes` as lower-case hex, two digits a byte.
pub fn encode(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(HEX[usize::from(b >> 4)]));
        s.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    s
}
