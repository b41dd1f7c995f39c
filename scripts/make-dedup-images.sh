#!/usr/bin/env bash
# Builds the eight ext4 images of issue 45's dedup goals in OUTDIR: each image
# is `mkfs.ext4 -d` of a tree made of COMMON_TREES (the same in all eight:
# parts of /usr/share and /usr/lib) plus one EXTRA_TREES entry of its own, so
# the shared files land at different offsets in each image (ext4 places them
# after that image's own tree, which sorts first). 4 KiB filesystem blocks
# (`-b 4096`): what ext4 uses above 512 MiB; below it mke2fs.conf's "small"
# type would pick 1 KiB blocks, which real volumes do not have. Each image is
# at most IMAGE_SIZE_MAX_MIB. The trees are hard-linked into a staging
# directory (the same filesystem as /usr here), or copied where that fails;
# the staging directory is removed at the end. Prints the images' sizes.
#
#   scripts/make-dedup-images.sh OUTDIR
#   cat OUTDIR/image-*.ext4 > all.img && lamina reduction estimate all.img
set -euo pipefail

OUTDIR=${1:?usage: make-dedup-images.sh OUTDIR}
IMAGE_SIZE_MAX_MIB=400
# Free space ext4 needs beyond the files: metadata, journal, slack.
IMAGE_OVERHEAD_PERCENT=15
IMAGE_OVERHEAD_MIB=48

COMMON_TREES=(/usr/share/man /usr/lib/python3.11)
EXTRA_TREES=(
  "/usr/lib/gcc"
  "/usr/include"
  "/usr/lib/postgresql /usr/libexec"
  "/usr/share/vim /usr/share/icons"
  "/usr/share/doc"
  "/usr/lib/node_modules /usr/share/i18n /usr/share/fonts /usr/share/java /usr/share/mime"
  "/usr/lib/python3 /usr/lib/udev /usr/share/perl5 /usr/share/X11"
  "/usr/share/package-lists"
)

mkdir -p "$OUTDIR"
STAGING=$(mktemp -d "$OUTDIR/staging.XXXXXX")
trap 'rm -rf "$STAGING"' EXIT

# link_tree SOURCE DESTINATION: hard links (no data copied), else a copy.
link_tree() {
  mkdir -p "$(dirname "$2")"
  cp -al "$1" "$2" 2>/dev/null || { rm -rf "$2"; cp -a "$1" "$2"; }
}

for index in "${!EXTRA_TREES[@]}"; do
  tree="$STAGING/tree-$index"
  for extra in ${EXTRA_TREES[$index]}; do
    link_tree "$extra" "$tree/a-own$extra"
  done
  for common in "${COMMON_TREES[@]}"; do
    link_tree "$common" "$tree/b-shared$common"
  done
  # Blocks the files take (a small file takes a whole block), and inodes.
  data_bytes=$(du -s --block-size=1 "$tree" | cut -f1)
  inode_count=$(( $(find "$tree" | wc -l) * 5 / 4 + 1024 ))
  size_mib=$(( data_bytes * (100 + IMAGE_OVERHEAD_PERCENT) / 100 / 1048576 + IMAGE_OVERHEAD_MIB ))
  if (( size_mib > IMAGE_SIZE_MAX_MIB )); then
    echo "image $index: ${EXTRA_TREES[$index]} needs ${size_mib} MiB > ${IMAGE_SIZE_MAX_MIB}" >&2
    exit 1
  fi
  image="$OUTDIR/image-$index.ext4"
  rm -f "$image"
  mkfs.ext4 -q -F -b 4096 -N "$inode_count" -d "$tree" "$image" "${size_mib}M" >/dev/null
  rm -rf "$tree"
  echo "image-$index.ext4 ${size_mib} MiB, files $(( data_bytes / 1048576 )) MiB: own ${EXTRA_TREES[$index]}"
done
