#!/bin/sh
# The base the image's test builds on (the Containerfile's BASE), made from the Debian
# packages this host has installed rather than downloaded by debootstrap (deploy/image/
# base.sh): the host must run the same release (bookworm). Only what the Containerfile's
# stages run: the shell and the tools rootfs.sh uses (coreutils, findutils, grep, sed,
# awk, dpkg, ldd, strip), Debian's Python with its venv module, the certificate
# authorities; each with the packages it depends on, copied from the host's files as
# dpkg lists them (their status records and file lists too, for dpkg -s and -S), trimmed
# as a slim image is (no documentation but the copyright files, no manuals, no
# translations). No apt: rootfs.sh installs nothing where its packages are in place.
# On a new machine this takes 3 s of CPU (the copy and buildah's commit) where
# debootstrap took 37.
#
#   sh deploy/image/base-from-host.sh IMAGE
#
# builds IMAGE (e.g. localhost/rsd-base:host) with buildah, as root.
set -eu
image=$1
. /etc/os-release
if [ "${VERSION_CODENAME:-}" != bookworm ]; then
  echo "base-from-host.sh: this host runs ${PRETTY_NAME:-an unknown system}, not Debian bookworm" >&2
  exit 1
fi
wanted="base-files bash dash coreutils findutils grep sed mawk dpkg libc-bin binutils python3 python3-venv ca-certificates"

# The packages wanted and, in turn, those they depend on (an alternative: the first one
# installed; a virtual package's providers are among the wanted ones where it matters).
installed=$(mktemp)
closure=$(mktemp)
files=$(mktemp)
trap 'rm -f "$installed" "$closure" "$files" "$files.keep"' EXIT
dpkg-query -W -f '${db:Status-Abbrev}\t${Package}\t${Pre-Depends}, ${Depends}\n' \
  | awk -F '\t' '$1 ~ /^ii/ {print $2 "\t" $3}' > "$installed"
awk -F '\t' -v wanted="$wanted" '
  { installed[$1] = 1; depends[$1] = $2 }
  END {
    n = split(wanted, queue, " ")
    for (i = 1; i <= n; i++) seen[queue[i]] = 1
    for (i = 1; i <= n; i++) {
      m = split(depends[queue[i]], groups, ",")
      for (j = 1; j <= m; j++) {
        k = split(groups[j], alternatives, "|")
        for (a = 1; a <= k; a++) {
          name = alternatives[a]
          sub(/\(.*/, "", name); gsub(/[ \t]/, "", name); sub(/:.*/, "", name)
          if (name in installed) {
            if (!(name in seen)) { seen[name] = 1; queue[++n] = name }
            break
          }
        }
      }
    }
    for (name in seen) if (!(name in installed)) { print "not installed: " name > "/dev/stderr"; exit 1 }
    for (name in seen) print name
  }' "$installed" > "$closure"
sort -o "$closure" "$closure"

container=$(buildah from scratch)
root=$(buildah mount "$container")
trap 'rm -f "$installed" "$closure" "$files" "$files.keep"; buildah rm "$container" > /dev/null' EXIT

# Their files as dpkg lists them, where the host has them, less what a slim image leaves
# out and what the stages do not run (a fifth of the base: binutils' programs but strip,
# the libraries only gprofng loads, iconv's character sets); the bytecode Debian compiled
# at install for their Python modules.
xargs dpkg-query -L < "$closure" | grep '^/.' | grep -v '^/\.$' | sort -u > "$files"
{ grep -v -E '^/usr/share/(doc/[^/]+/.|man/|info/|locale/|lintian/)|^/usr/bin/x86_64-linux-gnu-|^/usr/lib/x86_64-linux-gnu/(gconv|gprofng|libgprofng)' "$files"
  grep -E '^/usr/share/doc/[^/]+/copyright$|^/usr/bin/x86_64-linux-gnu-strip$' "$files"
  sed -n 's|^\(.*\)/\([^/]*\)\.py$|\1/__pycache__/\2.cpython-311.pyc|p' "$files"
} | sort -u > "$files.keep"
mv "$files.keep" "$files"
mkdir -p "$root/usr/bin" "$root/usr/sbin" "$root/usr/lib" "$root/usr/lib64"
for merged in bin sbin lib lib64; do ln -s "usr/$merged" "$root/$merged"; done  # merged /usr
while read -r path; do
  if [ -e "$path" ] || [ -L "$path" ]; then printf '%s\n' "${path#/}"; fi
done < "$files" > "$files.keep"
tar -C / --no-recursion -cf - -T "$files.keep" | tar -C "$root" -xf -

# What the packages' maintainer scripts make at install: the users, the certificate
# authorities' bundle (Mozilla's, as update-ca-certificates makes it), the loader's cache;
# dpkg's database of these packages.
mkdir -p "$root/etc" "$root/tmp" "$root/root" "$root/etc/ssl/certs" "$root/var/lib/dpkg/info"
chmod 1777 "$root/tmp"
printf 'root:x:0:0:root:/root:/bin/bash\n' > "$root/etc/passwd"
printf 'root:x:0:\n' > "$root/etc/group"
cat /usr/share/ca-certificates/mozilla/*.crt > "$root/etc/ssl/certs/ca-certificates.crt"
ldconfig -r "$root"
xargs dpkg-query -s < "$closure" > "$root/var/lib/dpkg/status"
while read -r package; do
  for list in /var/lib/dpkg/info/"$package".list /var/lib/dpkg/info/"$package":*.list; do
    if [ -e "$list" ]; then echo "$list"; fi
  done
done < "$closure" | xargs cp -t "$root/var/lib/dpkg/info/"
cp /var/lib/dpkg/info/format "$root/var/lib/dpkg/info/"  # (the lists' names: package:arch)
: > "$root/var/lib/dpkg/diversions"
: > "$root/var/lib/dpkg/statoverride"
# The commands Debian's alternatives name (awk: mawk), where the root has their programs.
mkdir -p "$root/etc/alternatives"
for alternative in /var/lib/dpkg/alternatives/*; do
  name=${alternative##*/}
  { read -r _ && read -r link; } < "$alternative" || continue
  target=$(readlink "/etc/alternatives/$name") || continue
  if [ -e "$root$target" ] && [ -n "$link" ]; then
    ln -s "$target" "$root/etc/alternatives/$name"
    ln -sf "/etc/alternatives/$name" "$root$link"
  fi
done

buildah umount "$container" > /dev/null
buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --cmd /bin/bash "$container"
buildah commit --quiet --rm "$container" "$image" > /dev/null
trap 'rm -f "$installed" "$closure" "$files" "$files.keep"' EXIT
