#!/bin/sh
# The build's C flags keep what bit-exact results need: -ffp-contract=off, so that no host
# compiler fuses a multiply-add in the kernel bodies shared with the CUDA code (whatever -march),
# and the gpu tests compare the GPU with the host bit for bit.
top_builddir=${top_builddir:-..}
fail=0

flags=$(sed -n 's/^FSDP_CFLAGS = //p' "$top_builddir/Makefile")
case " $flags " in
*" -ffp-contract=off "*) echo "ok: FSDP_CFLAGS has -ffp-contract=off: $flags" ;;
*)
    echo "FAILED: FSDP_CFLAGS lacks -ffp-contract=off: $flags"
    fail=1
    ;;
esac
# and every C compile line uses FSDP_CFLAGS (through AM_CFLAGS)
if grep -q '^AM_CFLAGS = .*\$(FSDP_CFLAGS)' "$top_builddir/lib/Makefile"; then
    echo "ok: lib's AM_CFLAGS carries FSDP_CFLAGS"
else
    echo "FAILED: lib's AM_CFLAGS does not carry FSDP_CFLAGS"
    fail=1
fi
exit $fail
