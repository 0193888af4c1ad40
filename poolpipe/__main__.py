from poolpipe.cli import main

raise SystemExit(main())
