from trio_direct.cli import main

raise SystemExit(main())
