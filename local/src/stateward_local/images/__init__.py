"""Container images for real nodes, built on this machine without a registry or Docker.

* ``catalog``: each image is an :class:`~stateward_local.images.catalog.ImageSpec`: how its
  root filesystem is made (debootstrap a Debian suite, or start from another image's layer;
  then Debian packages installed in a chroot; then a build hook) and the OCI config.
* ``rootfs``: making that root filesystem (debootstrap, chroot, apt, the build log).
* ``oci``: packing it into an OCI image-layout tar archive with one deterministic layer,
  which ``ctr images import`` names by its ``io.containerd.image.name`` annotation.
* ``cache``: archives in ``$STATEWARD_CACHE_DIR/images/<name>-<inputhash>.tar``, where the
  input hash covers the spec, the files it reads from ``images/<name>/`` (its sources and
  pip lock files) and the packer's version: a cache hit costs one small file read and a stat.
* ``locks`` and ``piplock``: the pip lock files of the images that hold a Python venv.
* ``nodestore``: the node images imported once into a containerd root that every real node
  starts from.

``images/*/Containerfile`` describe the same images for docker or buildah.
"""
