# cellcache in a scratch image from a dynamically linked binary: the binary plus exactly the
# shared libraries `ldd` lists for it (the C library, libm, libgcc_s…, and the dynamic
# loader), each at the path the binary asks for. Built by deploy/compose.sh when
# CELLCACHE_COMPOSE_BINARY names a binary (scripts/compose-check passes the release build
# scripts/readme-check made), so CI needs no second, static build; the context it gets is
# that tree only (rootfs/), never the repository. The static image is deploy/Dockerfile.
FROM scratch
COPY rootfs/ /
EXPOSE 11211
ENTRYPOINT ["/cellcache"]
CMD ["serve", "-l", "0.0.0.0", "-p", "11211"]
