#!/bin/sh
# The image's root file system, assembled in ROOT (the Containerfile's `rootfs` stage runs
# this as root in a Debian image): rsd's wheel and its dependencies in a virtual
# environment, /opt/rsd; Debian's Python; every shared library they load, as the dynamic
# loader resolves them; the user rsd (UID 10001) and its data directory, /var/lib/rsd.
# Nothing else: no shell, no package manager (the image runs rsd, rsctl and python3).
# The packages the files came from are recorded as distroless images record them
# (/var/lib/dpkg/status.d/, for scanners), with their copyright files.
#
#   sh rootfs.sh WHEELS ROOT
set -eu
wheels=$1
root=$2
venv=/opt/rsd

# Debian's packages, unless the base has them all (the test's, deploy/image/base-from-host.sh).
packages="python3 python3-venv binutils ca-certificates"
# shellcheck disable=SC2086
if [ "$(dpkg-query -W -f '${db:Status-Abbrev}\n' $packages 2>/dev/null | grep -c '^ii')" \
     != "$(echo $packages | wc -w)" ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  # shellcheck disable=SC2086
  apt-get install -y -q --no-install-recommends $packages
fi
# The environment without pip (nor setuptools): Debian's wheel of pip, run as it is,
# installs rsd's wheel into it, with its dependencies from PyPI.
python3 -m venv --without-pip "$venv"
"$venv/bin/python" "$(echo /usr/share/python-wheels/pip-*.whl)/pip" install -q --no-cache-dir \
  "$wheels"/rsd-*.whl
# Debug symbols are most of some wheels' extension modules (uvloop's: 13.6 MB of 15).
find "$venv" -name '*.so' -exec strip --strip-unneeded {} +

mkdir -p "$root"
cp -a /bin /lib /lib64 /sbin "$root/"  # the merged-/usr links
# (The certificate authorities are Debian's, where OpenSSL looks for them by default, for
# a client of rsd or etcd over TLS that names none of its own.)
cp -a --parents /usr/lib64/ld-linux-x86-64.so.2 /usr/bin/python3 /usr/bin/python3.11 \
  /usr/lib/python3.11 /usr/lib/os-release /etc/os-release /etc/ssl/certs/ca-certificates.crt \
  /usr/lib/ssl/cert.pem /usr/lib/ssl/certs "$root"
mkdir -p "$root$(dirname "$venv")"
mv "$venv" "$root$venv"  # (its links name /usr/bin/python3, there too; no second copy)
rm -rf "$root/usr/lib/python3.11/ensurepip" "$root/usr/lib/python3.11/lib2to3" \
  "$root/usr/lib/python3.11/distutils" "$root/usr/lib/python3.11/venv"

# The shared libraries of every program and extension module copied (and theirs), each
# under its real name with its soname's link beside it; libgcc_s, which glibc loads
# itself to unwind a cancelled thread.
find "$root/usr" "$root$venv" -type f \( -name '*.so*' -o -perm -u+x \) -exec ldd {} + 2>/dev/null \
  | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// && $2 ~ /^\(/ {print $1}' \
  | sort -u > /tmp/libraries
echo /lib/x86_64-linux-gnu/libgcc_s.so.1 >> /tmp/libraries
while read -r library; do
  real=$(readlink -f "$library")
  case $real in "$root"/*) continue ;; esac  # one a wheel brings, copied with it
  mkdir -p "$root$(dirname "$real")"
  cp -a "$real" "$root$(dirname "$real")/"
  name=$(basename "$library")
  if [ "$name" != "$(basename "$real")" ]; then
    ln -sf "$(basename "$real")" "$root$(dirname "$real")/$name"
  fi
done < /tmp/libraries

# The packages those files belong to: their copyright files and status records.
# (dpkg knows a library by the path its package ships, /lib/... for many: both are asked.)
find "$root" -type f ! -path "$root$venv/*" | sed -e "s|^$root||" -e p -e 's|^/usr/lib/|/lib/|' \
  | sort -u | xargs -r dpkg -S 2>/dev/null | cut -d: -f1 | tr ',' '\n' | tr -d ' ' > /tmp/packages
echo ca-certificates >> /tmp/packages  # its bundle is made at install, owned by none
sort -u -o /tmp/packages /tmp/packages
mkdir -p "$root/var/lib/dpkg/status.d"
while read -r package; do
  dpkg -s "$package" > "$root/var/lib/dpkg/status.d/$package"
  if [ -e "/usr/share/doc/$package/copyright" ]; then
    cp -a --parents "/usr/share/doc/$package/copyright" "$root"
  fi
done < /tmp/packages

# The user and its data directory (the deploy files' runAsUser), /tmp for Python.
mkdir -p "$root/etc" "$root/tmp" "$root/var/lib/rsd"
printf 'root:x:0:0:root:/root:/usr/sbin/nologin\nrsd:x:10001:10001:rsd:/var/lib/rsd:/usr/sbin/nologin\n' \
  > "$root/etc/passwd"
printf 'root:x:0:\nrsd:x:10001:\n' > "$root/etc/group"
chmod 1777 "$root/tmp"
chown 10001:10001 "$root/var/lib/rsd"
chmod 0750 "$root/var/lib/rsd"
