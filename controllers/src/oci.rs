//! OCI references as the delivery tools take them.

/// `oci://host/repository` of an image reference (tag and digest dropped).
pub fn oci_url(image: &str) -> String {
    let bare = image.trim_start_matches("oci://");
    let bare = bare.split('@').next().unwrap_or(bare);
    // A tag is a `:` after the last `/` (a `:` before it is the registry's port).
    let cut = match (bare.rfind('/'), bare.rfind(':')) {
        (Some(slash), Some(colon)) if colon > slash => &bare[..colon],
        (None, Some(colon)) => &bare[..colon],
        _ => bare,
    };
    format!("oci://{cut}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oci_urls_drop_tags_and_digests_but_keep_ports() {
        assert_eq!(
            oci_url("ghcr.io/pm/charts/op:1.2.3"),
            "oci://ghcr.io/pm/charts/op"
        );
        assert_eq!(
            oci_url("oci://localhost:5000/op:1.0"),
            "oci://localhost:5000/op"
        );
        assert_eq!(oci_url("localhost:5000/op"), "oci://localhost:5000/op");
        assert_eq!(oci_url("ghcr.io/op@sha256:abc"), "oci://ghcr.io/op");
    }
}
