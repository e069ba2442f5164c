//! The test image: Debian's busybox-static as a one-layer OCI image with the applets the tests use.
//! Included with `#[path]` next to `oci_image` by the tests and benchmarks that run containers.

use super::oci_image;

pub const BUSYBOX: &str = "docker.io/cairn-test/busybox:1";

const APPLETS: &[&str] = &[
    "sh", "echo", "cat", "sleep", "httpd", "wget", "nc", "hostname", "ip", "true", "false", "test", "touch", "rm",
    "dd", "mkdir", "head", "yes", "ls", "tar", "wc", "stty", "top", "ps", "nslookup",
];

/// The image as an OCI layout tarball (drop it in `agent/images/`).
pub fn busybox_image() -> Vec<u8> {
    busybox_image_named(BUSYBOX)
}

/// The same image under another name (a second tag for rollouts).
#[allow(dead_code)]
pub fn busybox_image_named(name: &str) -> Vec<u8> {
    let busybox = std::fs::read("/bin/busybox").expect("busybox-static is needed: apt-get install busybox-static");
    let mut image = oci_image::ImageBuilder::new(name).file("/bin/busybox", &busybox, 0o755).dir("/tmp", 0o1777);
    for applet in APPLETS {
        image = image.symlink(&format!("/bin/{applet}"), "busybox");
    }
    image.env("PATH=/bin").cmd(&["/bin/sh"]).oci_layout_tar()
}
