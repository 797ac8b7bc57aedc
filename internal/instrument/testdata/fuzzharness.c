/*
 * fuzzharness.c: runs the event library's parsers on inputs from FuzzLibrary
 * (fuzz_test.go), built with the library's sources included and with
 * AddressSanitizer and UndefinedBehaviorSanitizer, so that an out-of-bounds
 * access or undefined behaviour aborts it.
 *
 * Protocol on stdin/stdout, one exchange per input: the Go side writes a
 * little-endian u32 length and the input; the first byte chooses the parser,
 * the rest is its text:
 *   0 the KIPIMO_NATS URL          1 a duration (KIPIMO_PERIOD)
 *   2 a KIPIMO_INJECT list         3 bytes from the NATS server
 *   4 a name, written to a frame (UTF-8 repaired)
 * The harness answers with a u32 length and its output: for 4, the string as
 * encoded in the frame (uvarint length and bytes); otherwise a line that
 * describes what the parser understood.
 */
#include "../csrc/kipimo_core.c"
#include "../csrc/kipimo_cyg.c"
#include "../csrc/kipimo_device.c"

static int read_full(void *p, size_t n) {
	char *b = p;
	while (n > 0) {
		ssize_t r = read(0, b, n);
		if (r <= 0)
			return -1;
		b += r;
		n -= (size_t)r;
	}
	return 0;
}

static void reply(const char *p, size_t n) {
	uint32_t l = (uint32_t)n;
	if (write(1, &l, 4) != 4 || (n && write(1, p, n) != (ssize_t)n))
		exit(3);
}

int main(void) {
	static char in[1 << 20], out[1 << 16];
	for (;;) {
		uint32_t n;
		if (read_full(&n, 4) != 0)
			return 0;
		if (n > sizeof in - 1 || read_full(in, n) != 0)
			return 2;
		in[n] = 0;
		if (n == 0) {
			reply("", 0);
			continue;
		}
		const char *text = in + 1;
		size_t tlen = n - 1;
		int m = 0;
		switch ((unsigned char)in[0] % 5) {
		case 0:
			memset(K.nats_host, 0, sizeof K.nats_host);
			memset(K.nats_user, 0, sizeof K.nats_user);
			memset(K.nats_pass, 0, sizeof K.nats_pass);
			memset(K.nats_token, 0, sizeof K.nats_token);
			parse_nats_url(text);
			m = snprintf(out, sizeof out, "host=%s port=%s user=%s token=%s", K.nats_host, K.nats_port, K.nats_user, K.nats_token);
			break;
		case 1: {
			uint64_t d = 0;
			int rc = parse_duration_ns(text, &d);
			m = snprintf(out, sizeof out, "rc=%d ns=%llu", rc, (unsigned long long)d);
			break;
		}
		case 2:
			K.ninject = 0;
			parse_inject(text);
			m = snprintf(out, sizeof out, "n=%d", K.ninject);
			break;
		case 3:
			K.fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
			K.state = 2;
			K.inlen = K.ctrllen = 0;
			consume_input(text, tlen);
			m = snprintf(out, sizeof out, "pongs=%llu ctrl=%zu max_payload=%llu fd=%d", (unsigned long long)K.pongs, K.ctrllen,
			             (unsigned long long)K.max_payload, K.fd);
			if (K.fd >= 0)
				close(K.fd);
			K.fd = -1;
			K.state = 0;
			break;
		case 4:
			K.blen = 0;
			put_string(text);
			if (K.blen > sizeof out)
				K.blen = sizeof out;
			memcpy(out, K.buf, K.blen);
			m = (int)K.blen;
			break;
		}
		if (m < 0)
			m = 0;
		if ((size_t)m > sizeof out)
			m = sizeof out;
		reply(out, (size_t)m);
	}
}
