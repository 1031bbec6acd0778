//! Authentication beyond client certificates: bearer tokens from a static token file
//! (kube-apiserver's `--token-auth-file` CSV: `token,user,uid,"group1,group2"`).

use crate::dispatch::Identity;

/// Tokens and who they authenticate.
#[derive(Default)]
pub struct StaticTokens {
    entries: Vec<(Vec<u8>, Identity)>,
}

impl std::fmt::Debug for StaticTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print a token.
        write!(f, "StaticTokens({} entries)", self.entries.len())
    }
}

/// Splits one CSV line, honouring double quotes (a quoted field may contain commas).
fn csv_fields(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    for c in line.chars() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => out.push(std::mem::take(&mut field)),
            c => field.push(c),
        }
    }
    out.push(field);
    out
}

/// Constant-time equality, so response timing reveals nothing about a token.
fn same(a: &[u8], b: &[u8]) -> bool {
    let mut diff = a.len() ^ b.len();
    for i in 0..a.len().max(b.len()) {
        diff |= usize::from(a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0));
    }
    diff == 0
}

impl StaticTokens {
    /// Parses a token file; a bad line is an error naming its number.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut entries = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let f = csv_fields(line);
            if f.len() < 3 || f[0].is_empty() || f[1].is_empty() {
                return Err(format!(
                    "line {}: expected token,user,uid[,\"group1,group2\"]",
                    i + 1
                ));
            }
            let groups = f
                .get(3)
                .map(|g| {
                    g.split(',')
                        .map(str::trim)
                        .filter(|g| !g.is_empty())
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default();
            entries.push((
                f[0].as_bytes().to_vec(),
                Identity {
                    user: f[1].clone(),
                    groups,
                },
            ));
        }
        Ok(StaticTokens { entries })
    }

    /// Who a bearer token authenticates, if anyone. Every entry is compared.
    pub fn authenticate(&self, token: &str) -> Option<Identity> {
        let mut found = None;
        for (t, id) in &self.entries {
            if same(t, token.as_bytes()) && found.is_none() {
                found = Some(id.clone());
            }
        }
        found
    }
}

/// The token of an `Authorization: Bearer <token>` header.
pub fn bearer(header: Option<&str>) -> Option<&str> {
    let h = header?.trim();
    let (scheme, token) = h.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_authenticates() {
        let t =
            StaticTokens::parse("# comment\nsecret,bob,uid-1,\"viewers,dev\"\nother,carol,uid-2\n")
                .expect("parse");
        let bob = t.authenticate("secret").expect("bob");
        assert_eq!(bob.user, "bob");
        assert_eq!(bob.groups, vec!["viewers".to_string(), "dev".to_string()]);
        assert_eq!(
            t.authenticate("other").map(|i| i.user),
            Some("carol".to_string())
        );
        assert!(t.authenticate("secre").is_none());
        assert!(t.authenticate("secrets").is_none());
        assert!(t.authenticate("").is_none());
        assert!(StaticTokens::parse("just-a-token\n").is_err());
        assert_eq!(format!("{t:?}"), "StaticTokens(2 entries)");
    }

    #[test]
    fn bearer_headers() {
        assert_eq!(bearer(Some("Bearer abc")), Some("abc"));
        assert_eq!(bearer(Some("bearer  abc ")), Some("abc"));
        assert_eq!(bearer(Some("Basic abc")), None);
        assert_eq!(bearer(Some("Bearer ")), None);
        assert_eq!(bearer(None), None);
    }
}
