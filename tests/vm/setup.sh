#!/usr/bin/env bash
# Prepares the Soft-RoCE test VM (tests/vm/README.md): installs the host packages the harness
# needs, downloads Debian's current kernel package (nothing is installed on the host: it is
# unpacked into a cache), and builds a small initramfs (static busybox, the 9p/overlay/rxe
# modules and tests/vm/init). Idempotent: a second run finds everything in place in well under
# two seconds.
#
#   tests/vm/setup.sh [--no-install] [--print]
#
# --no-install skips apt-get install (run.sh uses it to rebuild a missing or stale cache);
# --print writes "kernel=PATH" and "initrd=PATH" on stdout (progress goes to stderr).
# Cache: ${GS_VM_CACHE:-$HOME/.cache/gradstream-vm}. Needs root (or sudo) only to install.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${GS_VM_CACHE:-${HOME:?}/.cache/gradstream-vm}
install=1
print=0
for arg in "$@"; do
  case $arg in
    --no-install) install=0 ;;
    --print) print=1 ;;
    -h | --help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "vm setup: unknown argument '$arg'" >&2; exit 2 ;;
  esac
done

sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi

# --- host packages -------------------------------------------------------------------------
packages=(qemu-system-x86 busybox-static ibverbs-utils perftest librdmacm-dev kmod rdma-core
  ibverbs-providers iproute2)
if ((install)); then
  # One dpkg-query for all packages; unknown ones print nothing, so count what is installed.
  installed=$(dpkg-query -W -f='${Package} ${db:Status-Status}\n' "${packages[@]}" 2>/dev/null |
    awk '$2 == "installed" { print $1 }' || true)
  missing=()
  for p in "${packages[@]}"; do
    grep -qx -- "$p" <<<"$installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    echo "vm setup: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    "${sudo_cmd[@]}" apt-get update -qq
    "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
fi

# --- kernel, pinned by what linux-image-amd64 depends on --------------------------------------
kernel_pkg() {
  apt-cache depends linux-image-amd64 2>/dev/null |
    awk '$1 == "Depends:" && $2 ~ /^linux-image-.*-amd64$/ { print $2; exit }'
}
# apt-cache takes 1-2 s here (no pkgcache.bin): reuse its answer until the package lists change.
lists_mtime=$(stat -c %Y /var/lib/apt/lists 2>/dev/null || echo 0)
kpkg='' mtime='' known=''
if [[ -f $cache/kernel-pkg ]]; then
  read -r mtime known <"$cache/kernel-pkg" || true
  if [[ ${mtime:-} == "$lists_mtime" ]]; then kpkg=${known:-}; fi
fi
[[ -n $kpkg ]] || kpkg=$(kernel_pkg)
if [[ -z $kpkg ]]; then
  if ((install)); then
    "${sudo_cmd[@]}" apt-get update -qq
    kpkg=$(kernel_pkg)
  fi
  if [[ -z $kpkg ]]; then
    echo "vm setup: apt-cache does not know linux-image-amd64 (run apt-get update)" >&2
    exit 1
  fi
fi
if [[ ${mtime:-} != "$lists_mtime" || ${known:-} != "$kpkg" ]]; then
  mkdir -p "$cache"
  echo "$lists_mtime $kpkg" >"$cache/kernel-pkg"
fi
kver=${kpkg#linux-image-}
kdir=$cache/$kver

# The initramfs depends on the kernel, this script, the guest init and busybox.
busybox=$(command -v busybox || true)
if [[ -z $busybox ]]; then
  echo "vm setup: busybox not found (apt-get install busybox-static)" >&2
  exit 1
fi
stamp=$(cat "$here/setup.sh" "$here/init" "$busybox" | sha256sum | cut -c1-16)
# One initramfs per stamp, so worktrees with different versions of these files share the cache.
initrd=$kdir/initramfs-$stamp
kernel_ready() { [[ -f $kdir/vmlinuz && -f $kdir/kernel-done ]]; }
done_now() {
  if ((print)); then
    local kernel=$kdir/vmlinux
    [[ -f $kernel ]] || kernel=$kdir/vmlinuz
    printf 'kernel=%s\ninitrd=%s\n' "$kernel" "$initrd"
  fi
  exit 0
}
if [[ -f $initrd && -f $cache/current && $(<"$cache/current") == "$kver" ]] && kernel_ready; then
  done_now
fi

mkdir -p "$cache"
exec 9>"$cache/.lock"
flock -w 600 9 || { echo "vm setup: cannot lock $cache/.lock" >&2; exit 1; }
# Someone else may have finished the work while we waited for the lock.
if [[ -f $initrd ]] && kernel_ready; then
  echo "$kver" >"$cache/current"
  done_now
fi

start=$SECONDS
if ldd "$busybox" >/dev/null 2>&1; then
  echo "vm setup: $busybox is dynamically linked (apt-get install busybox-static)" >&2
  exit 1
fi
mkdir -p "$kdir"
deb=$(find "$kdir" -maxdepth 1 -name "${kpkg}_*.deb" -print -quit)
if [[ -z $deb ]]; then
  echo "vm setup: downloading $kpkg into $kdir" >&2
  apt_opts=()
  if [[ $(id -u) -eq 0 ]]; then apt_opts=(-o APT::Sandbox::User=root); fi
  (cd "$kdir" && apt-get download -qq "${apt_opts[@]}" "$kpkg")
  deb=$(find "$kdir" -maxdepth 1 -name "${kpkg}_*.deb" -print -quit)
  [[ -n $deb ]] || { echo "vm setup: apt-get download $kpkg produced no .deb" >&2; exit 1; }
fi

echo "vm setup: unpacking $(basename "$deb") and building the initramfs" >&2
tree=$kdir/tree
rm -rf "$tree" "$kdir/initramfs.tmp"
dpkg -x "$deb" "$tree"
depmod -b "$tree" "$kver"
if ! kernel_ready; then
  cp "$tree/boot/vmlinuz-$kver" "$kdir/vmlinuz.tmp"
  mv "$kdir/vmlinuz.tmp" "$kdir/vmlinuz"
  # The uncompressed ELF kernel boots through PVH straight into Linux: under TCG that skips
  # about 5 s of firmware and in-guest xz decompression. Else run.sh boots the bzImage.
  extract_vmlinux() {  # like the kernel's scripts/extract-vmlinux: first stream to ELF
    local magic=$1 off
    shift
    off=$(LC_ALL=C grep -abo -m1 "$magic" "$kdir/vmlinuz" | head -n1 | cut -d: -f1) || return 1
    [[ -n $off ]] || return 1
    tail -c "+$((off + 1))" "$kdir/vmlinuz" | "$@" >"$kdir/vmlinux.tmp" 2>/dev/null || true
    [[ $(head -c4 "$kdir/vmlinux.tmp" | od -An -tx1 | tr -d ' ') == 7f454c46 ]]
  }
  if extract_vmlinux $'\xfd7zXZ\x00' xz -dc || extract_vmlinux $'\x28\xb5\x2f\xfd' zstd -qdc ||
    extract_vmlinux $'\x1f\x8b\x08' gzip -dc; then
    mv "$kdir/vmlinux.tmp" "$kdir/vmlinux"
  else
    rm -f "$kdir/vmlinux.tmp" "$kdir/vmlinux"
    echo "vm setup: could not extract vmlinux; booting the bzImage (about 5 s slower)" >&2
  fi
  touch "$kdir/kernel-done"
fi

# The modules with their dependencies (builtin ones print "builtin X"), uncompressed, under
# /lib/modules/KVER with a modules.dep for just them: one busybox modprobe loads them all.
modules=(virtio_pci 9pnet_virtio 9p overlay crc32_generic crc32c_generic ib_uverbs rdma_ucm
  rdma_rxe veth)
root=$kdir/initramfs.tmp
mdir=$root/lib/modules/$kver
mkdir -p "$root"/{bin,proc,sys,dev,ctl,host,ovl,newroot} "$mdir"
for m in "${modules[@]}"; do
  modprobe -d "$tree" -S "$kver" --show-depends "$m"
done | awk '$1 == "insmod" && !seen[$2]++ { print $2 }' >"$kdir/modules.paths"
while read -r path; do
  rel=${path#"$tree/lib/modules/$kver/"}
  mkdir -p "$mdir/$(dirname "$rel")"
  case $rel in
    *.ko.xz) xz -dc "$path" >"$mdir/${rel%.xz}" ;;
    *.ko.zst) zstd -qdc "$path" >"$mdir/${rel%.zst}" ;;
    *) cp "$path" "$mdir/$rel" ;;
  esac
done <"$kdir/modules.paths"
(cd "$mdir" && find . -name '*.ko' | sed 's|^\./||') >"$kdir/modules.kept"
sed -E 's/\.ko\.(xz|zst)/.ko/g' "$tree/lib/modules/$kver/modules.dep" |
  awk 'NR == FNR { keep[$1 ":"] = 1; next } $1 in keep' "$kdir/modules.kept" - >"$mdir/modules.dep"
echo "${modules[*]}" >"$root/modules.list"

cp "$busybox" "$root/bin/busybox"
for applet in sh mount mkdir modprobe chroot stty reboot sync; do
  ln -s busybox "$root/bin/$applet"
done
install -m 0755 "$here/init" "$root/init"
(cd "$root" && find . -mindepth 1 | LC_ALL=C sort | "$busybox" cpio -o -H newc 2>/dev/null) \
  >"$initrd.tmp"
mv "$initrd.tmp" "$initrd"

# Keep the .deb (a changed init rebuilds without downloading), drop the 400 MB tree, older
# kernels and initramfs versions unused for a week (a running QEMU keeps its open files).
rm -rf "$tree" "$root"
find "$kdir" -maxdepth 1 -name 'initramfs-*' ! -name "initramfs-$stamp" -atime +7 -delete
for old in "$cache"/*/kernel-done; do
  old=${old%/kernel-done}
  if [[ -d $old && $old != "$kdir" ]]; then rm -rf "$old"; fi
done
echo "$kver" >"$cache/current"
echo "vm setup: $kver ready in $cache ($((SECONDS - start)) s, initramfs $(du -k "$initrd" | cut -f1) KiB)" >&2
done_now
